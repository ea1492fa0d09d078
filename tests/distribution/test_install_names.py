"""What each install of edge claims (build_backend.py, setup.py, pyproject.toml [tool.edge.scripts]).

A wheel of edge, which is what a device or an app installs, carries the package ``edge`` and the
device's console scripts only: ``image`` and ``bench`` are other projects' names on the package
index. A checkout's editable install, the build host's, has the build-host tools too.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["edge"]["scripts"]

pytestmark = pytest.mark.process


def _run(*cmd, cwd=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """pip's wheel of the checkout: what `pip install .` or a package index gives."""
    out = tmp_path_factory.mktemp("wheel")
    # The build's own environment is this venv's setuptools: the same backend, no download.
    got = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, REPO)
    assert got.returncode == 0, got.stderr[-2000:]
    (path,) = out.glob("edge-*.whl")
    return path


def test_the_wheel_claims_only_the_name_edge(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top = {n.split("/")[0] for n in names}
        dist_info = next(t for t in top if t.endswith(".dist-info"))
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert top == {"edge", dist_info}, sorted(top)
    assert not any(n.startswith(("image/", "bench/")) for n in names)
    for name, target in SCRIPTS["device"].items():
        assert f"{name} = {target}" in entry_points
    for name in SCRIPTS["build-host"]:
        assert f"{name} =" not in entry_points, f"{name} would be a console script without its module"


def test_a_venv_holding_only_the_wheel_imports_edge_and_not_image_or_bench(wheel, tmp_path):
    venv = tmp_path / "device"
    got = _run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert got.returncode == 0, got.stderr
    python = venv / "bin" / "python"
    got = _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel)
    assert got.returncode == 0, got.stderr[-2000:]
    site = next((venv / "lib").glob("python3*/site-packages"))
    claimed = {p.name for p in site.iterdir()} - {"__pycache__"}
    assert {n for n in claimed if not n.endswith(".dist-info")} == {"edge"}, sorted(claimed)
    empty = tmp_path / "cwd"
    empty.mkdir()  # not the checkout: its image/ and bench/ must not be found from the working directory
    for name in ("image", "bench"):
        got = _run(python, "-c", f"import {name}", cwd=empty)
        assert got.returncode != 0 and "ModuleNotFoundError" in got.stderr, (name, got.stderr)
    got = _run(python, "-c", "import edge, sys; print(edge.__file__)", cwd=empty)
    assert got.returncode == 0 and got.stdout.strip().startswith(str(site)), got
    for name in SCRIPTS["device"]:
        assert (venv / "bin" / name).exists(), name
    for name in SCRIPTS["build-host"]:
        assert not (venv / "bin" / name).exists(), name


def test_the_checkout_install_has_every_console_script():
    """The README's commands run in the checkout's editable install: each script there answers --help."""
    bin_dir = Path(sys.executable).parent
    for name in [*SCRIPTS["device"], *SCRIPTS["build-host"]]:
        script = bin_dir / name
        assert script.exists(), f"{name}: not installed by `pip install -e .` ({bin_dir})"
        got = _run(script, "--help")
        assert got.returncode == 0 and "usage:" in got.stdout, (name, got.stderr[-1000:])
