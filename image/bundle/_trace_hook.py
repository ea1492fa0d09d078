"""Run ``edge.boot`` with a recorder attached; executed as ``python -c <this source> BOOT_ARGS``.

This file is not imported by the build tool: its source is handed to the target
environment's interpreter, so it may use the stdlib only and must not leave any
module of its own in ``sys.modules``. The runtime does not know it is watched:
an audit hook records every file Python opens, every ``ctypes`` dlopen and every
program it starts; ``edge.system.notify.notify`` is wrapped so the first ``READY=``
takes a snapshot of ``sys.modules`` and ``/proc/self/maps`` (what the native
loader mapped, including libraries loaded through ctypes). At exit, after the
parent has exercised the server and sent SIGTERM, a second snapshot is merged
and everything is written as JSON to ``$EDGE_TRACE_OUT``.
"""

import atexit
import json
import os
import runpy
import sys

_OUT = os.environ.pop("EDGE_TRACE_OUT")
_opened = set()
_dlopened = set()
_executed = []
_snapshots = {}


def _audit(event, args):
    # Called for every audited event in the process: keep it cheap and never raise.
    try:
        if event == "open":
            path = args[0]
            if isinstance(path, (str, bytes)):
                _opened.add(os.path.abspath(os.fsdecode(path)))
        elif event == "ctypes.dlopen":
            if args[0]:
                _dlopened.add(os.fsdecode(args[0]))
        elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec"):
            _executed.append(os.fsdecode(args[0]) if not isinstance(args[0], (list, tuple)) else str(args[0][0]))
    except Exception:  # noqa: BLE001 - a recorder must never break the runtime
        pass


def _mapped_files():
    files = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[4] != "0" and parts[5].startswith("/"):
                files.add(parts[5].rstrip("\n").removesuffix(" (deleted)"))
    return files


def _module_files():
    files = {}
    for name, mod in list(sys.modules.items()):
        for attr in ("__file__", "__cached__"):
            value = getattr(mod, attr, None)
            if isinstance(value, str) and os.path.isabs(value):
                files.setdefault(name, []).append(value)
    return files


def _snapshot(tag):
    _snapshots[tag] = {"maps": sorted(_mapped_files()), "modules": _module_files()}


def _prefix():
    # Under -S (how the runtime starts) site never ran, and site is what sets sys.prefix
    # to a virtual environment; the environment is where pyvenv.cfg lies.
    env = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    return env if os.path.exists(os.path.join(env, "pyvenv.cfg")) else sys.prefix


def _dump():
    if "exit" not in _snapshots:
        _snapshot("exit")
    record = {
        "executable": sys.executable,
        "prefix": _prefix(),
        "base_prefix": sys.base_prefix,
        "sys_path": sys.path,
        "version": list(sys.version_info[:3]),
        "ready": "ready" in _snapshots,
        "snapshots": _snapshots,
        "opened": sorted(_opened),
        "dlopened": sorted(_dlopened),
        "executed": _executed,
    }
    with open(_OUT, "w") as f:
        json.dump(record, f)


sys.addaudithook(_audit)
atexit.register(_dump)
_real_exit = os._exit


def _dump_then_exit(code):
    """The runtime ends with os._exit (edge/boot.py ``exit_without_finalizing``): no atexit then."""
    atexit.unregister(_dump)
    _dump()
    _real_exit(code)


os._exit = _dump_then_exit

import edge.system.notify as _notify_module  # noqa: E402 - after the hook, so its files are recorded

_real_notify = _notify_module.notify


def _notify_and_snapshot(*fields):
    if "ready" not in _snapshots and any(f.startswith("READY=") for f in fields):
        _snapshot("ready")
    return _real_notify(*fields)


_notify_module.notify = _notify_and_snapshot
sys.argv = ["edge.boot", *sys.argv[1:]]
runpy.run_module("edge.boot", run_name="__main__", alter_sys=True)
