"""``edge-package build``: the command line of the package builder (``image/package.py``).

Checks every argument before the minute of work starts, turns Ctrl-C and SIGTERM into a clean
stop (nothing half-written, the staging directory removed) and each failure into one message
with an exit code (:data:`EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from edge.config.command_line import exit_epilog, fail
from edge.errors import PackageError
from edge.preload.fallback import FALLBACK_DEVICES, FALLBACK_ENGINES
from edge.preload.manifest import MANIFEST_NAME
from image.bundle.progress import stop_signals
from image.cli_checks import writable_dir_problem
from image.fresh_boot import REPORT_FILE as FRESH_BOOT_REPORT
from image.package import BuildSteps, build_package, compare_builds
from image.quantize import QUANTIZE_CHOICES, REPORT_FILE, FallbackMismatch, fallback_problem, fallback_request

__all__ = ["main", "EXIT_CODES"]


EXIT_CODES = {
    0: "the package was built (with --check-determinism: and a second build, its fresh-boot budgets pinned to the "
       "first's, matched it byte for byte)",
    1: "--check-determinism: the second build differs (the files are listed)",
    2: "usage error, or unusable input: --out cannot be written or holds something else, "
       "a --prune-corpus file cannot be read, the --fallback-* options name a fallback that cannot stand in "
       "(not a valid package, no files for the engine, another tokenizer, a torchscript fallback of an int8 package)",
    3: "the build failed (the message names the step), or the build extras are not installed",
    130: "interrupted (Ctrl-C): nothing was written, a package already at --out is kept",
    143: "terminated (SIGTERM): nothing was written, a package already at --out is kept",
}
_EPILOG = exit_epilog(EXIT_CODES)
_PLATFORM_HELP = (
    "the CPU that will run the package's model.ort, not this build host's. arm (default, the Jetson): "
    "the converter leaves out its x86-only NCHWc layout rewrites, so the file loads on arm64 and x86-64 "
    "alike. amd64: allows them; such a model.ort is for x86-64 hosts only and may not load on a Jetson. "
    "The manifest records the choice (engines.onnxruntime.ort_target_platform)")
_QUANTIZE_HELP = (
    "int8: quantize the ONNX Runtime model's weights to int8 (onnxruntime.quantization, dynamic) and measure it "
    "against the full model on the parity texts (manifest: quantization; timings in quantization.json). The "
    "package carries the onnxruntime engine only; the build fails if its worst cosine is under 0.99")
_FRESH_HELP = (
    "the fresh start's budget of ENGINE in ms (manifest: selftest.fresh_boot_budget_ms), pinned instead of "
    "measured, e.g. a figure measured on the device with `edge-coldstart --cache cold`; repeat per engine. "
    "Without it each engine's is 3 x its slowest of 3 fresh boots on this host, rounded up (image/fresh_boot.py)")
_FALLBACK_HELP = (
    "a package to serve when this one cannot (e.g. one built with --quantize int8): copied into this package as "
    "fallback/ and pinned by its package_sha256 (manifest: fallback). Same source and tokenizer as this package")


def _out_problem(out: Path) -> str | None:
    """Why a package cannot be written at ``out`` (None: it can); checked before the minute of work."""
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file; give a directory (new, empty, or a package to replace)"
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_NAME).exists():
        return (f"--out {out} is a directory that is not a model package (no {MANIFEST_NAME}); not replacing "
                f"it: give a new or empty directory, or an existing package")
    return writable_dir_problem(out)


def _corpus_problem(files: list[Path]) -> str | None:
    """Why a --prune-corpus file cannot be read (None: all can)."""
    for f in files:
        if not f.exists():
            return f"--prune-corpus {f}: no such file; give text files, one text per line"
        if f.is_dir():
            return f"--prune-corpus {f} is a directory; give the text files in it (e.g. {f}/*.txt)"
        try:
            open(f, "rb").close()
        except OSError as exc:
            return f"--prune-corpus {f}: cannot read it ({exc.strerror or exc})"
    return None


def _engine_ms(text: str) -> tuple[str, float]:
    """``ENGINE=MS`` of --fresh-boot-budget-ms: an engine this builder writes and a number of ms above 0."""
    engine, _, ms = text.partition("=")
    if engine not in ("onnxruntime", "torchscript"):
        raise argparse.ArgumentTypeError(f"{text!r}: give ENGINE=MS with ENGINE onnxruntime or torchscript")
    try:
        value = float(ms)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: MS must be a number of milliseconds above 0")
    return engine, value


def _fail(message: str, code: int) -> int:
    return fail("edge-package build", message, code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge-package", description=__doc__.split("\n\n")[0], epilog=_EPILOG)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="export all-MiniLM-L6-v2 into a model package",
                       description="Export all-MiniLM-L6-v2 into a model package directory.", epilog=_EPILOG)
    b.add_argument("--out", required=True, type=Path, help="package directory (an existing package there is replaced)")
    b.add_argument("--prune-corpus", nargs="+", type=Path, metavar="FILE",
                   help="domain text files; prune the vocabulary and the embedding rows to what they need")
    b.add_argument("--ort-target-platform", choices=("arm", "amd64"), default="arm", help=_PLATFORM_HELP)
    b.add_argument("--quantize", choices=QUANTIZE_CHOICES, help=_QUANTIZE_HELP)
    b.add_argument("--fallback-package", type=Path, metavar="DIR", help=_FALLBACK_HELP)
    b.add_argument("--fallback-engine", choices=FALLBACK_ENGINES,
                   help="the fallback's engine (default: onnxruntime, if the fallback has it). Without "
                        "--fallback-package: this package's own weights on that engine")
    b.add_argument("--fallback-device", choices=FALLBACK_DEVICES,
                   help="the fallback's device (default: cpu, when any --fallback-* option is given): on a Jetson, "
                        "the CPU when the GPU path hangs or throttles")
    b.add_argument("--fresh-boot-budget-ms", type=_engine_ms, action="append", default=[], metavar="ENGINE=MS",
                   help=_FRESH_HELP)
    b.add_argument("--check-determinism", action="store_true",
                   help="build a second time beside --out and report files that differ (exit 1 if any)")
    args = parser.parse_args(argv)
    out = Path(os.path.abspath(args.out))
    BuildSteps.last = ""
    with stop_signals() as stopped:
        try:
            return _checked_build(out, args, stopped)
        except Exception as exc:  # noqa: BLE001 - one message, not a traceback; the type names a bug
            if stopped.signum is not None:  # a child we stopped, failing as it went
                return _fail(f"{stopped.word}; nothing half-written was left at or beside {out}", stopped.exit_code)
            if isinstance(exc, FileExistsError):  # --out filled by someone else meanwhile
                return _fail(f"{exc}: give a new or empty --out", 2)
            if isinstance(exc, FallbackMismatch):  # found once the tokenizer is compiled, seconds in
                return _fail(str(exc), 2)
            step = f" at step {BuildSteps.last}" if BuildSteps.last else ""
            return _fail(f"the build failed{step}: {type(exc).__name__}: {exc}\n"
                         f"nothing half-written was left at or beside {out}", 3)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (Terminated)
            return _fail(f"{stopped.word}; nothing half-written was left at or beside {out}", stopped.exit_code or 130)


def _import_native_modules() -> None:
    """The build's native extensions (image/package.py and export_model.py import them later, and
    then find them loaded): their import is where an interrupt must wait (Stopped.held)."""
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import safetensors  # noqa: F401
    import torch  # noqa: F401


def _checked_build(out: Path, args, stopped) -> int:
    """The inputs checked first (a mistake costs no minute of work), then the build."""
    problem = _out_problem(out) or _corpus_problem(args.prune_corpus or [])
    if problem:
        return _fail(problem, 2)
    try:
        fallback = fallback_request(args.fallback_package, args.fallback_engine, args.fallback_device)
    except PackageError as exc:
        return _fail(f"--fallback-package {args.fallback_package} is not a usable model package: {exc}", 2)
    engines = ["onnxruntime"] if args.quantize else ["onnxruntime", "torchscript"]
    problem = fallback and fallback_problem(fallback, out, engines)
    if problem:
        if args.quantize and fallback["engine"] == "torchscript" and not fallback["package"]:
            problem = ("--fallback-engine torchscript: a --quantize int8 package carries the onnxruntime engine only; "
                       "give a --fallback-package that has torchscript files, or leave out --quantize")
        return _fail(problem, 2)
    pinned = dict(args.fresh_boot_budget_ms)
    if set(pinned) - set(engines):
        return _fail(f"--fresh-boot-budget-ms {', '.join(sorted(set(pinned) - set(engines)))}: this package has no "
                     f"files for that engine (it will have {', '.join(engines)})", 2)
    options = {"prune_corpus": args.prune_corpus, "ort_target_platform": args.ort_target_platform,
               "quantize": args.quantize, "fallback": fallback, "fresh_boot_budget_ms": pinned or None}
    from edge.runtime.default_package import missing_build_modules

    missing = missing_build_modules()
    if missing:
        return _fail(f"the build extras are not installed here (missing: {', '.join(missing)}); "
                     f"install them with `pip install 'edge[build]'`", 3)
    with stopped.held():  # a Ctrl-C inside a native module's initialisation would abort the process
        _import_native_modules()
    out = build_package(out, **options)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    summary = {"package": str(out), "name": manifest["name"], "package_sha256": manifest["package_sha256"],
               "files": {n: e["size"] for n, e in manifest["files"].items()}}
    if "quantization" in manifest:
        summary["quantization"] = manifest["quantization"]["measured"]
        report = out / REPORT_FILE  # the timings: in no hash, beside the manifest
        if report.is_file():
            summary["quantization_timings"] = json.loads(report.read_text())
    if "fallback" in manifest:
        summary["fallback"] = manifest["fallback"]
    fresh = (manifest.get("selftest") or {}).get("fresh_boot_budget_ms")
    if fresh:
        summary["fresh_boot_budget_ms"] = fresh
        report = out / FRESH_BOOT_REPORT  # the runs: in no hash, beside the manifest
        if report.is_file():
            summary["fresh_boot_runs_ms"] = json.loads(report.read_text())["runs"]
    print(json.dumps(summary, indent=2))
    if args.check_determinism:
        if fresh:  # the one measured input: the second build takes the first's figures (image/fresh_boot.py)
            options["fresh_boot_budget_ms"] = fresh
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            again = build_package(Path(tmp) / "again", **options)
            diff = compare_builds(out, again)
        print(json.dumps({"nondeterministic": diff}, indent=2))
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
