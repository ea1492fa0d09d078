"""Every stage name in a boot timeline is the name of the function that runs it: grep lands on code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import edge
from edge.runtime.stages import Stages
from edge.runtime.timeline import Timeline

EDGE = Path(edge.__file__).parent
# Measured by the kernel and the interpreter before any of our code runs, and edge/boot.py's own
# module-level imports (its module body, which no function runs): no function to name.
NOT_A_FUNCTION = {"interpreter", "boot_imports"}


def definitions(name: str) -> list[str]:
    """Places in edge/ that define a function or method ``name``."""
    pattern = re.compile(rf"^\s*def {re.escape(name)}\(", re.M)
    return [f"{p.relative_to(EDGE)}" for p in EDGE.rglob("*.py") if pattern.search(p.read_text())]


def test_a_stage_is_named_after_its_function():
    def load_something(x):
        return x * 2

    timeline = Timeline(exec_s=0.0)
    assert Stages(timeline).run(load_something, 21, setting="--x") == 42
    assert [s["stage"] for s in timeline.as_dict()["stages"]] == ["load_something"]


def test_every_stage_boot_runs_names_a_function_in_edge():
    """Both engines' paths, read from the boot's code itself (boot.py, the engine's chain, the
    snapshot point): each ``stages.run(fn, ...)``'s fn is defined in edge/."""
    names = set()
    nodes = [n for f in ("boot.py", "runtime/engine_chain.py", "runtime/snapshot.py") for n in ast.walk(ast.parse((EDGE / f).read_text()))]
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if callee == "run" and node.args:
                first = node.args[0]
                names.add(first.attr if isinstance(first, ast.Attribute) else getattr(first, "id", None))
    assert None not in names
    assert {"open_package", "select_engine", "import_engine", "verify_package", "load_engine", "warm_buckets",
            "import_tokenizer", "load_tokenizer", "import_server", "prepare_tokenizer", "bind", "start",
            "restore_hook"} <= names, names
    for name in names:
        assert definitions(name), f"stage {name!r}: no `def {name}(` in edge/"


@pytest.mark.process
def test_a_real_timeline_greps_to_code(ort_runtime):
    import json

    record = json.loads((ort_runtime.workdir / "timeline.json").read_text())
    stages = {s["stage"] for s in record["stages"]}
    assert {"import_manifest", "load_engine", "warm_buckets", "bind", "start"} <= stages, stages
    # a fresh boot leaves ONNX Runtime's prepacking off: it would be paid before READY (--ort-prepacking auto)
    assert next(s for s in record["stages"] if s["stage"] == "load_engine")["prepacking"] is False
    # from exec to the first stage of boot(), every millisecond belongs to a stage
    ordered = sorted(record["stages"], key=lambda s: s["start_ms"])
    assert [s["stage"] for s in ordered[:3]] == ["interpreter", "boot_imports", "parse_serve_args"], ordered[:4]
    first_boot_stage = ordered[3]["start_ms"]
    covered = ordered[2]["end_ms"]
    assert ordered[0]["end_ms"] == ordered[1]["start_ms"] and ordered[1]["end_ms"] <= ordered[2]["start_ms"]
    # ms: serve()'s set-up (rlimit, signals), 0.4-3 ms here; the 60 ms the issue found had no stage
    assert first_boot_stage - covered < 15.0, ordered[:5]
    for name in stages - NOT_A_FUNCTION:
        assert definitions(name), f"timeline stage {name!r}: no `def {name}(` in edge/"
