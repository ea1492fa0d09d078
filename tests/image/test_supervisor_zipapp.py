"""image/supervisor_zipapp.py: edge-supervise built from edge/supervise/ into one deterministic file,
which runs on a bare python3 (``-I -S``, from an empty directory) and imports nothing outside the
standard library and its own modules."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from image import supervisor_zipapp as Z

REPO = Path(__file__).resolve().parents[2]


def test_two_builds_are_byte_identical_at_any_path(tmp_path):
    a = Z.build(tmp_path / "a" / "edge-supervise")
    b = Z.build(tmp_path / "b" / "edge-supervise")
    copy = tmp_path / "checkout"  # the same sources elsewhere: no path, owner or time goes in
    for rel in ("edge/__init__.py", "edge/system", "edge/supervise"):
        src, dst = REPO / rel, copy / rel
        (shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
         else (dst.parent.mkdir(parents=True, exist_ok=True), shutil.copy2(src, dst)))
    c = Z.build(tmp_path / "c" / "edge-supervise", root=copy)
    data = (tmp_path / "a" / "edge-supervise").read_bytes()
    assert data == (tmp_path / "b" / "edge-supervise").read_bytes() == (tmp_path / "c" / "edge-supervise").read_bytes()
    assert a["sha256"] == b["sha256"] == c["sha256"] == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "a" / "edge-supervise").stat().st_mode & 0o777 == 0o755


def test_the_file_is_a_shebang_and_a_sorted_stored_zip_of_the_closure(tmp_path):
    out = tmp_path / "edge-supervise"
    Z.build(out)
    assert out.read_bytes().startswith(b"#!/usr/bin/python3\n")
    with zipfile.ZipFile(out) as z:
        infos = z.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names) and names[0] == "__main__.py"
    assert all(i.date_time == (1980, 1, 1, 0, 0, 0) and i.compress_type == zipfile.ZIP_STORED
               and i.external_attr >> 16 == 0o100644 and i.create_system == 3 for i in infos)
    assert names[1:] == list(Z.closure())
    # The supervisor and what it shares with the runtime and the tools, one copy each; nothing else.
    assert {"edge/system/socket_dir.py", "edge/system/notify.py", "edge/system/snapshot_rules.py",
            "edge/supervise/main.py", "edge/__init__.py", "edge/system/__init__.py"} <= set(names)
    assert {n.split("/")[1] for n in names if n.count("/") == 2} == {"system", "supervise"}
    assert "edge/system/log.py" not in names and not any(n.endswith(".pyc") for n in names)


def test_a_third_party_import_fails_the_build_naming_it(tmp_path):
    root = tmp_path / "src"
    for rel in ("edge/__init__.py", "edge/supervise/__init__.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text('"""x"""\n')
    (root / "edge/supervise/main.py").write_text("import json\n\n\ndef f():\n    import numpy\n")
    with pytest.raises(Z.ClosureError, match=r"main.py:5: imports numpy, which is not in the standard library"):
        Z.closure(root)
    (root / "edge/supervise/main.py").write_text("from edge.nowhere import x\n")
    with pytest.raises(Z.ClosureError, match="imports edge.nowhere, which is not a module of edge"):
        Z.closure(root)


def test_edge_bundle_supervisor_writes_the_file(tmp_path, capsys):
    from image.build_bundle import main

    assert main(["supervisor", "--out", str(tmp_path / "lib" / "edge-supervise")]) == 0
    said = json.loads(capsys.readouterr().out)
    data = (tmp_path / "lib" / "edge-supervise").read_bytes()
    assert said["sha256"] == hashlib.sha256(data).hexdigest() and said["bytes"] == len(data)


# What the built file imports, run the way the host runs it but isolated (-I: no PYTHON* variables,
# no user site, no script directory; -S: no site-packages, so not the checkout's editable install).
_IMPORTS = r"""
import io, json, sys, contextlib
sys.path.insert(0, sys.argv[1])
from edge.supervise.main import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["--probe", "ipc:///nonexistent/edge.sock", "--probe-timeout", "0.2"])
    main(["--cleanup", "--id", "edge-nonexistent-zipapp", "--runc", sys.argv[2]])
print(json.dumps({name: getattr(m, "__file__", None) for name, m in sorted(sys.modules.items())}))
"""


def test_the_built_file_runs_on_the_standard_library_alone(tmp_path):
    out = tmp_path / "lib" / "edge-supervise"
    Z.build(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    py = [sys.executable, "-I", "-S"]
    r = subprocess.run([*py, str(out), "--help"], cwd=empty, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: edge-supervise"), r.stdout + r.stderr
    assert "--snapshot {auto,off}" in r.stdout and "--cleanup" in r.stdout
    runc = shutil.which("runc") or "/bin/true"
    r = subprocess.run([*py, str(out), "--cleanup", "--id", "edge-nonexistent-zipapp", "--runc", runc], cwd=empty,
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")  # as before: runc's refusal is not an error
    r = subprocess.run([*py, str(out), "--probe", "ipc:///nonexistent/edge.sock"], cwd=empty, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and json.loads(r.stdout)["ready"] is False, r.stdout + r.stderr
    assert list(empty.iterdir()) == []  # nothing written where it ran (no bytecode either)
    r = subprocess.run([*py, "-c", _IMPORTS, str(out), runc], cwd=empty, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    modules = json.loads(r.stdout.splitlines()[-1])
    with zipfile.ZipFile(out) as z:
        inside = set(z.namelist())
    outside = sorted(name for name in modules if name.split(".")[0] not in sys.stdlib_module_names
                     and name.split(".")[0] != "edge" and name != "__main__")  # -c's own
    assert outside == [], outside
    edge = {name: path for name, path in modules.items() if name.split(".")[0] == "edge"}
    assert "edge.supervise.main" in edge and "edge.system.socket_dir" in edge and "edge.system.notify" in edge
    for name, path in edge.items():  # each from the file itself, none from the checkout
        assert path is not None and path.startswith(str(out) + "/"), (name, path)
        assert path[len(str(out)) + 1:] in inside, (name, path)
