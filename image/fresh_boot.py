"""The fresh start's budget of a model package, ``selftest.fresh_boot_budget_ms``, measured by the
package build (image/package.py) for each engine the package carries.

A device restores its runtime from a snapshot (docs/snapshot.md) and ``edge selftest`` holds that
start to the package's ``boot_budget_ms`` (1500 ms, the design card's). Where no snapshot can be
taken (no CRIU >= 4.1, a kernel without its support, ``EDGE_SNAPSHOT=off``) every start is fresh,
and a fresh TorchScript boot does not fit 1.5 s (``import torch`` alone is about 1 s here); there
the self-test holds a fresh start to this budget instead (docs/selftest.md, "The boot budget").

Measured: :data:`RUNS` fresh boots of the staged package per engine, each ``python -m edge.boot``
of this interpreter with ``--package`` the staged directory, on the CPU (``EDGE_DEVICE=cpu``, the
path the build host's bundle runs), with a private ipc socket, HOME and state directory, to
READY on a warm page cache (the builder has just written every file); the figure is the boot's
own ``exec_to_ready_ms``, the one ``edge selftest`` reads from ``stats``.

The margin: the budget is :data:`MARGIN` (3) times the slowest run, rounded up to the next step of
:func:`ladder_ms` (1, 1.5, 2, 3, 4, 6, 8, 12 s ...), and never under the package's
``boot_budget_ms``. Three is the product of two factors measured on this kind of host (LAB notes,
docs/coldstart.md): a cold page cache, as after an update or a reboot (ORT 0.31 -> 0.51 s,
``import torch`` 3.4 -> 4.6 s: x1.35 to x1.65), and a busy or slower CPU (the same boots under a
load average of 1-2 on 2 cores: x2 to x3; a Jetson's cores are slower than a build host's). The
ladder adds up to half again, and makes two builds on one host land on the same figure, which
the package's determinism needs: the figure is the one input of a build that is measured. Where
it is known better (``edge-coldstart --cache cold`` on the device itself), pin it:
``edge-package build --fresh-boot-budget-ms torchscript=MS`` (no boot is measured for a pinned
engine), as ``--check-determinism`` pins its second build to the first's figures.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["RUNS", "MARGIN", "REPORT_FILE", "ladder_ms", "budget_ms", "measure_fresh_boots", "fresh_boot_budgets"]

RUNS = 3  # fresh boots per engine; the slowest counts
MARGIN = 3.0  # x the slowest run (see the module docstring)
READY_DEADLINE_S = 180.0  # one boot's exec to READY on the build host (a fresh TorchScript boot: 1.3-9 s here)
REPORT_FILE = "fresh_boot.json"  # the runs' figures, beside the manifest: no hash covers it, no bundle carries it


def ladder_ms(ms: float) -> float:
    """The smallest step of 1000 * 2**k or 1500 * 2**k ms (k >= 0) at or above ``ms``."""
    k = max(0, math.ceil(math.log2(max(ms, 1.0) / 1000.0)) - 1)
    while True:
        for step in (1000.0 * 2 ** k, 1500.0 * 2 ** k):
            if step >= ms:
                return step
        k += 1


def budget_ms(runs_ms: list[float], floor_ms: float) -> float:
    """The fresh budget from the measured runs (ms): MARGIN x the slowest, on the ladder, at least ``floor_ms``."""
    return max(float(floor_ms), ladder_ms(MARGIN * max(runs_ms)))


def _one_boot(package: Path, engine: str, work: Path) -> float:
    """One fresh boot of ``package`` on ``engine`` to READY; its exec_to_ready_ms."""
    from edge.system.readiness import NotifiedProcess, NotReady

    for name in ("timeline.json", "edge.sock"):
        (work / name).unlink(missing_ok=True)
    (work / "home").mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(work / "home"), "EDGE_STATE_DIR": str(work / "state"), "EDGE_DEVICE": "cpu",
           "PYTHONDONTWRITEBYTECODE": "1"}
    for name in ("EDGE_PACKAGE", "EDGE_ENGINE", "EDGE_ADDRESS", "EDGE_TIMELINE"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "edge.boot", "--package", str(package), "--engine", engine,
           "--bind", f"ipc://{work}/edge.sock", "--timeline", str(work / "timeline.json")]
    proc = NotifiedProcess(cmd, notify_path=work / "notify.sock", log_path=work / f"boot-{engine}.log", env=env)
    try:
        proc.wait_ready(READY_DEADLINE_S)
        timeline = json.loads((work / "timeline.json").read_text())  # written before READY (edge/boot.py)
    except NotReady as exc:
        raise RuntimeError(f"the fresh boot of the {engine} engine, measured for selftest.fresh_boot_budget_ms, "
                           f"did not become ready: {exc}") from None
    finally:
        proc.stop(30.0)
    return float(timeline["exec_to_ready_ms"])


def measure_fresh_boots(package: Path, engines: list[str], runs: int = RUNS, say=lambda msg: None) -> dict[str, list[float]]:
    """``{engine: [exec_to_ready_ms of each run]}`` for ``package`` (a complete package directory)."""
    work = Path(tempfile.mkdtemp(prefix="edge-fb-", dir="/tmp" if os.access("/tmp", os.W_OK) else None))  # short: AF_UNIX
    try:
        out = {}
        for engine in engines:
            out[engine] = []
            for i in range(runs):
                out[engine].append(round(_one_boot(package, engine, work), 1))
                say(f"fresh boot {i + 1}/{runs} of {engine}: {out[engine][-1]:.0f} ms")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fresh_boot_budgets(package: Path, engines: list[str], floor_ms: float, pinned: dict[str, float] | None = None,
                       say=lambda msg: None) -> tuple[dict[str, float], dict]:
    """(``{engine: budget ms}`` for the manifest, the report for :data:`REPORT_FILE`): ``pinned``
    engines take the given figure, the others are measured (:func:`measure_fresh_boots`)."""
    pinned = dict(pinned or {})
    unknown = sorted(set(pinned) - set(engines))
    if unknown:
        raise ValueError(f"--fresh-boot-budget-ms names {', '.join(unknown)}, which this package has no files for "
                         f"(it has {', '.join(engines)})")
    measured = measure_fresh_boots(package, [e for e in engines if e not in pinned], say=say)
    budgets = {e: float(pinned[e]) if e in pinned else budget_ms(measured[e], floor_ms) for e in engines}
    report = {"margin": MARGIN, "runs": measured, "pinned": sorted(pinned), "floor_ms": floor_ms,
              "budget_ms": budgets, "python": sys.executable}
    return budgets, report
