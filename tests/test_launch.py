"""edge/runtime/launch.py: the device's command line (python -S) and the byte code it needs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import edge
from edge.runtime.launch import boot_argv, boot_env, boot_pythonpath, boot_pythonpath_of, compile_bytecode

EDGE_ROOT = str(Path(edge.__file__).resolve().parent.parent)


def test_boot_argv_skips_site():
    argv = boot_argv("/opt/venv/bin/python")
    assert argv == ["/opt/venv/bin/python", "-S", "-m", "edge.boot"]


def test_pythonpath_holds_edge_then_site_packages_and_keeps_the_callers():
    paths = boot_pythonpath()
    assert paths[0] == EDGE_ROOT
    assert any(p.endswith("site-packages") for p in paths[1:])
    env = boot_env({"PYTHONPATH": "/extra/one" + os.pathsep + paths[0]})
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[: len(paths)] == paths and parts[-1] == "/extra/one" and parts.count(paths[0]) == 1


def test_boot_pythonpath_of_this_interpreter_matches():
    import sys

    assert boot_pythonpath_of(sys.executable) == boot_pythonpath()


def test_the_runtime_imports_without_site():
    """What boot imports resolves from PYTHONPATH alone, and site (with its .pth files) never runs."""
    code = ("import sys, json, edge.boot, edge.preload.tokenizer, edge.ipc.server, edge.engines.ort_capi, numpy; "
            "print(json.dumps({'site': 'site' in sys.modules, 'no_site': sys.flags.no_site}))")
    out = subprocess.run([*boot_argv()[:2], "-c", code], env=boot_env(), capture_output=True, text=True,
                         check=True, cwd="/").stdout
    assert json.loads(out) == {"site": False, "no_site": 1}


def test_compile_bytecode_writes_current_pyc_files():
    import importlib.util

    count = compile_bytecode()
    root = Path(edge.__file__).resolve().parent
    assert count == sum(1 for _ in root.rglob("*.py")) > 30
    for module in ("edge/boot.py", "edge/preload/manifest.py", "edge/ipc/server.py"):
        source = Path(EDGE_ROOT) / module
        cached = Path(importlib.util.cache_from_source(str(source)))
        assert cached.exists() and cached.stat().st_mtime >= source.stat().st_mtime, module
