"""The architecture as a contract: the import layers of pyproject.toml's [tool.importlinter],
the same list in docs/architecture.md, no import cycle anywhere, and a short top of edge/."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.imports import cycles, graph

REPO = Path(__file__).resolve().parents[1]
# Modules directly in edge/ besides its subpackages: the design card's boot.py and warmup.py, the
# `edge` console entry, the bottom layer's error codes, the package's own __init__ (version).
TOP_MODULES = {"__init__.py", "boot.py", "warmup.py", "cli.py", "errors.py"}
# The layer packages this layout added: empty but for a docstring, so importing one costs nothing.
LAYER_PACKAGES = ("config", "system", "observability", "observability/metrics", "runtime", "commands", "update",
                  "serving", "supervise")


def _contract_layers() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    return layers


def test_lint_imports_keeps_every_contract():
    """import-linter's contracts (the layers, edge/ never importing image/ or bench/, pydantic
    off the boot path, ZeroMQ only in the transport, the supervisor on the standard library and
    edge.system) over the code as it is."""
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail(f"{lint} is missing: pip install -e '.[test]' installs import-linter")
    r = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "BROKEN" not in r.stdout and r.stdout.count("KEPT") == 5, r.stdout


def test_the_docs_list_the_contracts_layers_in_order():
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("<!-- layers -->", 1)[1].split("<!-- /layers -->", 1)[0]
    documented = re.findall(r"^- `([a-z_.]+)`: \S", block, flags=re.M)
    assert documented == _contract_layers()


def test_every_module_of_edge_is_in_a_layer():
    layers = _contract_layers()
    mods = graph(REPO, ("edge",))
    loose = sorted(m for m in mods if m != "edge" and not any(m == layer or m.startswith(layer + ".") for layer in layers))
    assert loose == []


def test_no_import_cycle_in_edge_image_or_bench():
    """Every import counts: inside functions, under TYPE_CHECKING, importlib.import_module of a literal."""
    found = cycles(graph(REPO, ("edge", "image", "bench")))
    assert found == [], "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("import importlib\nimportlib.import_module('pkg.a')\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    assert cycles(graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_top_of_edge_holds_few_modules():
    top = {p.name for p in (REPO / "edge").glob("*.py")}
    assert top == TOP_MODULES, sorted(top ^ TOP_MODULES)
    assert len(top) <= 8


@pytest.mark.parametrize("package", LAYER_PACKAGES)
def test_a_layer_package_imports_nothing(package):
    tree = ast.parse((REPO / "edge" / package / "__init__.py").read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert body == [], f"edge/{package}/__init__.py holds code: keep it a docstring (import time is a budget)"
