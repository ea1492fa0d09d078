"""An interrupt that comes while native modules initialise waits for them (Stopped.held): a
KeyboardInterrupt raised inside pybind11's initialisation of torch or onnx aborts the process
(std::terminate), so `edge serve`'s first-use build exited 3 (-6) instead of 130."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A module whose initialisation is interrupted halfway: the signal arrives while its top-level
# code runs, as a Ctrl-C lands inside `import torch`.
INTERRUPTED_MODULE = """
import os, signal
os.kill(os.getpid(), signal.{sig})
for _ in range(1000):  # Python code runs on after the signal: where a handler that raises would raise
    pass
FINISHED = True
"""

PROBE = """
import sys
from image.bundle.progress import stop_signals
with stop_signals() as stopped:
    try:
        with stopped.held():
            import interrupted_module
        print("not raised", flush=True)
    except KeyboardInterrupt as exc:
        print(type(exc).__name__, interrupted_module.FINISHED, stopped.exit_code, flush=True)
        sys.exit(stopped.exit_code)
"""


def _probe(tmp_path: Path, sig: str, held: bool = True) -> subprocess.CompletedProcess:
    (tmp_path / "interrupted_module.py").write_text(INTERRUPTED_MODULE.format(sig=sig))
    code = PROBE if held else PROBE.replace("with stopped.held():", "if True:")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": f"{REPO}:{tmp_path}", "PATH": "/usr/bin:/bin"})


def test_a_sigint_inside_a_held_import_is_raised_once_the_import_has_finished(tmp_path):
    r = _probe(tmp_path, "SIGINT")
    assert (r.returncode, r.stdout.split()) == (130, ["KeyboardInterrupt", "True", "130"]), r


def test_a_sigterm_inside_a_held_import_is_raised_as_terminated(tmp_path):
    r = _probe(tmp_path, "SIGTERM")
    assert (r.returncode, r.stdout.split()) == (143, ["Terminated", "True", "143"]), r


def test_without_holding_the_interrupt_lands_inside_the_import(tmp_path):
    """The control: the same module, not held, is cut off in its own code (what makes pybind11 abort)."""
    r = _probe(tmp_path, "SIGINT", held=False)
    assert r.returncode != 0 and "KeyboardInterrupt" in r.stderr and "interrupted_module" in r.stderr, r
    assert r.returncode != signal.SIGABRT
