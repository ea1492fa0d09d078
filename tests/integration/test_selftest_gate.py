"""``edge selftest`` against the real runtime serving the real package, as an updater runs it:
the CLI, the greenboot check, the RAUC unit's command and the Mender state script (deploy/)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge.preload.manifest import SELFTEST_MIN_COSINE, manifest_digest, open_package
from support.parity import ABS_MAX, COSINE_MIN  # the engines' tolerance against sentence-transformers

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

CLI_TIMEOUT_S = 60


def _env(runtime, package: Path, **extra) -> dict:
    """What the updater's environment would hold: `edge` on PATH, the runtime's address, its package."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
               EDGE_ADDRESS=runtime.address, EDGE_PACKAGE=str(package), **extra)
    return env


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


@pytest.fixture(scope="module")
def other_package(minilm_package, tmp_path_factory) -> Path:
    """A package that is not the served one: the real one's files, its manifest without the reference."""
    root = tmp_path_factory.mktemp("other") / "pkg"
    root.mkdir()
    for p in minilm_package.iterdir():
        if p.name != "manifest.json":
            (root / p.name).symlink_to(p.resolve())
    data = json.loads((minilm_package / "manifest.json").read_text())
    data.pop("selftest")  # as a package built before the reference was stored
    data["package_sha256"] = manifest_digest(data)
    (root / "manifest.json").write_text(json.dumps(data))
    return root


def test_stored_reference_equals_sentence_transformers(minilm_package, st_model):
    ref = open_package(minilm_package, verify="none").manifest.selftest
    assert ref is not None and ref.min_cosine == SELFTEST_MIN_COSINE == COSINE_MIN
    assert ref.computed_with["engine"] == "onnxruntime" and ref.computed_with["file"] == "model.ort"
    want = st_model.encode([ref.text], convert_to_numpy=True)[0].astype(np.float64)  # (384,)
    got = np.asarray(ref.embedding, dtype=np.float64)
    cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine >= COSINE_MIN, cosine
    assert float(np.abs(got - want).max()) <= ABS_MAX


def test_older_package_still_opens(other_package):
    assert open_package(other_package, verify="size").manifest.selftest is None


def test_selftest_passes_against_the_real_runtime(ort_runtime, minilm_package):
    proc = _run(["edge", "selftest", "--json", "--timeout", "30"], _env(ort_runtime, minilm_package))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] and [c["name"] for c in report["checks"]] == ["ready", "package", "reference",
                                                                          "boot_budget"]
    assert all(c["passed"] is True for c in report["checks"]), report
    c = {x["name"]: x for x in report["checks"]}
    assert c["reference"]["measured"]["cosine"] >= 0.9999 and c["reference"]["measured"]["engine"] == "onnxruntime"
    assert c["boot_budget"]["measured"]["budget_source"] == "the package's"
    assert 0 < c["boot_budget"]["measured"]["exec_to_ready_ms"] <= c["boot_budget"]["measured"]["budget_ms"]
    assert report["package_source"] == "EDGE_PACKAGE"


def test_selftest_names_the_wrong_package(ort_runtime, other_package):
    proc = _run(["edge", "selftest", "--timeout", "30"], _env(ort_runtime, other_package))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"^FAIL  package .* wrong package: the server runs package_sha256", proc.stdout, re.M)
    assert proc.stdout.splitlines()[-1].startswith("edge selftest: FAIL (package; not run: reference)")


def test_greenboot_check(ort_runtime, minilm_package, other_package):
    script = DEPLOY / "greenboot" / "50-edge.sh"
    assert os.access(script, os.X_OK)
    proc = _run([str(script)], _env(ort_runtime, minilm_package))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("edge selftest: PASS")
    assert _run([str(script)], _env(ort_runtime, other_package)).returncode == 1


def test_mender_state_script(ort_runtime, minilm_package, other_package):
    script = DEPLOY / "mender" / "ArtifactCommit_Enter_50_edge-selftest"
    assert _run([str(script)], _env(ort_runtime, minilm_package)).returncode == 0
    assert _run([str(script)], _env(ort_runtime, other_package)).returncode == 1


def test_rauc_unit_marks_good_or_bad(ort_runtime, minilm_package, other_package, tmp_path):
    """The unit's ExecStart, with `rauc` and `systemctl` replaced by stubs that record their arguments."""
    unit = (DEPLOY / "rauc" / "edge-mark-good.service").read_text()
    (command,) = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    argv = command.split(" ", 2)
    assert argv[:2] == ["/bin/sh", "-c"]
    script = argv[2].strip("'")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("rauc", "systemctl"):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{tmp_path}/calls"\n')
        (stubs / name).chmod(0o755)
    for package, calls in ((minilm_package, ["rauc status mark-good"]),
                           (other_package, ["rauc status mark-bad", "systemctl reboot"])):
        (tmp_path / "calls").unlink(missing_ok=True)
        env = _env(ort_runtime, package)
        env["PATH"] = f"{stubs}{os.pathsep}{env['PATH']}"
        proc = _run(["/bin/sh", "-c", script], env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (tmp_path / "calls").read_text().splitlines() == calls


def test_no_server_is_exit_2(minilm_package, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = _run(["edge", "selftest", "--connect", f"ipc://{tmp_path}/absent.sock", "--package", str(minilm_package),
                 "--timeout", "0.5"], env)
    assert proc.returncode == 2 and "FAIL  ready" in proc.stdout


@pytest.fixture(autouse=True)
def _edge_on_path():
    if shutil.which("edge", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("the `edge` console script is not installed beside this interpreter (pip install -e .)")
