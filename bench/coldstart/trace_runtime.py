"""Run ``edge.boot`` and record every file it opened or mapped (the cold-cache eviction list).

    EDGE_COLDSTART_TRACE=OUT.json python bench/coldstart/trace_runtime.py [edge.boot args]

Used once per invocation, untimed, before cold runs: an audit hook collects the paths of
``open`` events (Python sources, bytecode, data files), and when the runtime stops (SIGTERM)
the files of ``sys.modules`` and of ``/proc/self/maps`` (native libraries, the mapped model)
are added. The launcher also reads ``/proc/PID/maps`` while the runtime serves. Run by path so
nothing but the runtime itself is imported.
"""

import json
import os
import sys

_opened: set = set()


def _audit(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes)):
        _opened.add(os.fsdecode(args[0]))


def _mapped() -> set:
    out = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    out.add(parts[5].strip())
    except OSError:
        pass
    return out


def main() -> int:
    out = os.environ.pop("EDGE_COLDSTART_TRACE")
    # The script's own directory would shadow nothing, but keep sys.path as `python -m` has it.
    sys.path[0] = os.getcwd()
    sys.addaudithook(_audit)
    import runpy

    sys.argv = ["edge.boot", *sys.argv[1:]]
    code = 0
    try:
        runpy.run_module("edge.boot", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        files = {os.path.abspath(p) for p in _opened} | _mapped()
        files.update(getattr(m, "__file__", None) or "" for m in list(sys.modules.values()))
        with open(out, "w") as f:
            json.dump({"files": sorted(p for p in files if p and os.path.isfile(p))}, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
