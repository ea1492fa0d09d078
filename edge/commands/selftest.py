"""``edge selftest``: the health gate an OS updater runs after it boots a new image.

A client of the running server (protocol v1, docs/protocol.md) and a reader of the manifest of
the package it serves. Four checks, in this order (docs/selftest.md):

1. ``ready``: ``health`` answers ``ready: true`` (polled until ``--timeout`` ends, so the gate can
   run while the service is still starting);
2. ``package``: the package directory read here (``--package``, ``$EDGE_PACKAGE``, the device's
   :data:`DEVICE_PACKAGE`, a build host's default package) is the one the server runs: its
   ``package_sha256`` equals the one ``stats`` reports in its lineage;
3. ``reference``: the server's embedding of the manifest's reference text (``selftest.text``,
   stored by image/package.py) has a cosine of at least ``selftest.min_cosine`` with the
   embedding stored beside it;
4. ``boot_budget``: the boot's ``exec_to_ready_ms`` (``stats``' timeline) is within the package's
   ``selftest.boot_budget_ms``.

Exit status: 0 when all pass; 1 when a check failed; 2 when no server answered at all (and for
usage errors), as for the other client commands (:data:`edge.cli.EXIT_CODES`). Nothing is added
to the protocol: everything comes from ``health``, ``stats`` and ``infer``.

Imported by ``edge``'s parser: standard library only at module level.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from dataclasses import dataclass, field

__all__ = ["CHECKS", "DEVICE_PACKAGE", "Check", "Report", "add_arguments", "find_package", "run", "run_checks"]

CHECKS = ("ready", "package", "reference", "boot_budget")
# The package of the installed bundle, seen from the host (the container sees it at
# /opt/edge/package; image/bundle/rootfs.py PACKAGE_PATH): where the updater's gate runs.
DEVICE_PACKAGE = "/opt/edge/bundle/current/rootfs/opt/edge/package"
POLL_S = 0.1  # between health probes while the server is not up yet (s)
PROBE_TIMEOUT_S = 2.0  # one health probe's wait (s); health is answered in ms, even under load
MIN_REQUEST_S = 1.0  # least wait given to stats and infer once ready, even with --timeout nearly spent (s)


@dataclass
class Check:
    """One check's outcome; ``passed`` None: not run (a check it needs failed)."""

    name: str  # one of CHECKS
    passed: bool | None
    detail: str  # one sentence for a person: what was seen, and what to do when it failed
    measured: dict = field(default_factory=dict)  # the values compared (ms, cosine, digests)

    def as_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "detail": self.detail, "measured": self.measured}


@dataclass
class Report:
    checks: list[Check]
    address: str
    package: str | None  # the package directory read (None: none found)
    package_source: str  # which setting named it
    no_server: bool = False  # no reply at all within --timeout: exit status 2
    elapsed_ms: float = 0.0

    @property
    def passed(self) -> bool:
        return all(c.passed is True for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.passed is False]

    @property
    def not_run(self) -> list[str]:
        return [c.name for c in self.checks if c.passed is None]

    @property
    def exit_status(self) -> int:
        return 0 if self.passed else 2 if self.no_server else 1

    def as_dict(self) -> dict:
        from edge import __version__

        return {"passed": self.passed, "exit_status": self.exit_status, "failed": self.failed, "not_run": self.not_run,
                "address": self.address, "package": self.package, "package_source": self.package_source,
                "elapsed_ms": round(self.elapsed_ms, 1), "edge_version": __version__,
                "checks": [c.as_dict() for c in self.checks]}


def add_arguments(p) -> None:
    """``edge selftest``'s own options (``--connect``, ``--timeout`` and the keys come from edge/cli.py)."""
    p.add_argument("--package", metavar="DIR", default=None,
                   help=f"the served package's directory, whose manifest holds the reference (default: env "
                        f"EDGE_PACKAGE, else {DEVICE_PACKAGE} where it exists, else a build host's default "
                        f"package, the one `edge serve` builds)")
    p.add_argument("--json", action="store_true", help="print one JSON document (checks with name, passed, detail, "
                                                       "measured) instead of one line per check")
    p.add_argument("--allow-missing-reference", action="store_true",
                   help="pass the reference check when the package has no stored reference (packages built "
                        "before it); without it such a package fails")
    from edge.config.argtypes import positive_number

    p.add_argument("--budget-ms", type=positive_number("ms"), default=None, metavar="MS",
                   help="boot budget, exec to ready in ms (default: the package's selftest.boot_budget_ms, "
                        "else 1500)")


def find_package(given: str | None, env: dict | None = None) -> tuple[str | None, str]:
    """(directory or None, where it came from): --package, EDGE_PACKAGE, the device's, a build host's."""
    environ = os.environ if env is None else env
    if given:
        return given, "--package"
    if environ.get("EDGE_PACKAGE"):
        return environ["EDGE_PACKAGE"], "EDGE_PACKAGE"
    if os.path.isdir(DEVICE_PACKAGE):
        return DEVICE_PACKAGE, "the device's bundle"
    from edge.runtime.default_package import default_package_dir

    build_host = default_package_dir()
    if build_host.is_dir():
        return str(build_host), "the build host's default package"
    return None, f"none found: not {DEVICE_PACKAGE}, nor {build_host}"


# ------------------------------------------------------------------ the checks


def wait_ready(client, address: str, deadline: float) -> tuple[Check, bool]:
    """Poll ``health`` until it says ready or ``deadline`` (time.monotonic) passes; (check, answered)."""
    from edge.errors import EdgeError
    from edge.ipc.endpoint import check_ipc_server

    t0 = time.monotonic()
    last, answered, body = "nothing tried", False, None
    while True:
        remaining = deadline - time.monotonic()
        try:
            check_ipc_server(address)  # a socket file that is not there yet: the service may be starting
            body = client.health(timeout_s=max(0.05, min(PROBE_TIMEOUT_S, remaining)))
            answered = True
            if body.get("ready"):
                waited = (time.monotonic() - t0) * 1000
                return Check("ready", True, f"the server at {address} is ready (state {body.get('state')}, "
                                            f"up {body.get('uptime_s', 0):.1f} s)",
                             {"state": body.get("state"), "uptime_s": body.get("uptime_s"),
                              "waited_ms": round(waited, 1)}), True
            last = f"state {body.get('state')}"
        except FileNotFoundError as exc:
            why = exc.strerror or str(exc)  # check_ipc_server always sets strerror
            if exc.errno == errno.ENOTSOCK:  # a setting to fix, not a server still starting
                return Check("ready", False, why), False
            last = why
        except TimeoutError as exc:
            last = str(exc)
        except EdgeError as exc:
            answered, last = True, f"health refused: {exc}"
        if time.monotonic() + POLL_S >= deadline:
            break
        time.sleep(POLL_S)
    waited = time.monotonic() - t0
    if answered:
        return Check("ready", False, f"the server at {address} answered but was not ready within {waited:.1f} s "
                                     f"({last})", {"state": (body or {}).get("state")}), True
    return Check("ready", False, f"no server answered at {address} within {waited:.1f} s ({last}); is edge.service "
                                 f"running? (`systemctl status edge`; --connect, EDGE_ADDRESS)"), False


def check_package(stats: dict, package: str | None, source: str):
    """(check, manifest or None): the package read here is the one the server runs."""
    from edge.errors import PackageError
    from edge.preload.manifest import open_package

    lineage = stats.get("lineage") or {}
    served = lineage.get("package_sha256")
    measured = {"package_dir": package, "source": source, "served_package_sha256": served,
                "served_model": lineage.get("model")}
    if package is None:
        return Check("package", False, f"no package directory ({source}); pass --package DIR or set EDGE_PACKAGE "
                                       f"to the served package's directory", measured), None
    try:
        manifest = open_package(package, verify="none").manifest  # the manifest and its own digest
    except PackageError as exc:
        return Check("package", False, f"cannot read the package at {package} ({source}): {exc}", measured), None
    measured.update(package_sha256=manifest.package_sha256, name=manifest.name, model_sha256=manifest.model_sha256)
    if served is None:
        return Check("package", False, "the server's stats name no package_sha256 in their lineage", measured), None
    if served != manifest.package_sha256:
        return Check("package", False, f"wrong package: the server runs package_sha256 {served[:16]}... "
                                       f"({lineage.get('model')}), the package at {package} ({source}) is "
                                       f"{manifest.package_sha256[:16]}... ({manifest.name}); pass --package the "
                                       f"served package's directory", measured), None
    return Check("package", True, f"the server runs the package at {package} ({manifest.name}, package_sha256 "
                                  f"{served[:16]}...)", measured), manifest


def check_reference(client, manifest, allow_missing: bool, timeout_s: float) -> Check:
    """The server's embedding of the stored reference text against the stored embedding."""
    import numpy as np

    from edge.errors import EdgeError

    ref = manifest.selftest
    if ref is None:
        if allow_missing:
            return Check("reference", True, "not available in this package (its manifest has no selftest "
                                            "reference); passed because of --allow-missing-reference",
                         {"available": False})
        return Check("reference", False, "not available in this package (built before edge-package stored a "
                                         "reference: its manifest has no selftest); rebuild the package, or pass "
                                         "--allow-missing-reference to accept it unchecked", {"available": False})
    try:
        result = client.embed([ref.text], timeout_s=timeout_s)
    except TimeoutError as exc:
        return Check("reference", False, f"embedding the reference text: {exc}", {"available": True})
    except EdgeError as exc:
        return Check("reference", False, f"embedding the reference text: the server refused: {exc}",
                     {"available": True})
    got = np.asarray(result.embeddings[0], dtype=np.float64)  # (D,)
    want = np.asarray(ref.embedding, dtype=np.float64)  # (D,)
    meta = result.meta
    measured = {"available": True, "min_cosine": ref.min_cosine, "dim": int(got.shape[0]),
                "tokens": (meta.get("token_counts") or [None])[0], "engine": meta.get("engine"),
                "device": meta.get("device"), "computed_with": ref.computed_with, "trace_id": meta.get("trace_id")}
    if got.shape != want.shape:
        return Check("reference", False, f"the server's embedding has {got.shape[0]} values, the stored one "
                                         f"{want.shape[0]}", measured)
    norms = float(np.linalg.norm(got) * np.linalg.norm(want))
    cosine = float(got @ want) / norms if norms > 0 else 0.0
    measured.update(cosine=round(cosine, 9), max_abs_diff=float(np.abs(got - want).max()))
    served = f"{meta.get('engine')}/{meta.get('device')}"
    built = f"{ref.computed_with.get('engine', '?')}/{ref.computed_with.get('device', '?')}"
    if cosine >= ref.min_cosine:
        return Check("reference", True, f"cosine {cosine:.7f} >= {ref.min_cosine:g} with the stored embedding "
                                        f"(served by {served}, stored by {built})", measured)
    return Check("reference", False, f"cosine {cosine:.7f} < {ref.min_cosine:g}: the server ({served}) embeds the "
                                     f"reference text differently from the build ({built}); the engine, the "
                                     f"device's libraries or the package files are not what was built", measured)


def check_boot_budget(stats: dict, manifest, budget_ms: float | None) -> Check:
    """The boot's exec-to-ready time (stats' timeline) against the package's budget."""
    from edge.preload.manifest import DEFAULT_BOOT_BUDGET_MS

    if budget_ms is not None:
        budget, source = budget_ms, "--budget-ms"
    elif manifest is not None and manifest.selftest is not None:
        budget, source = manifest.selftest.boot_budget_ms, "the package's"
    else:
        budget, source = DEFAULT_BOOT_BUDGET_MS, "the default"
    measured = {"budget_ms": budget, "budget_source": source}
    timeline = stats.get("timeline")
    if not isinstance(timeline, dict) or timeline.get("exec_to_ready_ms") is None:
        why = timeline.get("error") if isinstance(timeline, dict) and timeline.get("error") else "none reported"
        return Check("boot_budget", False, f"the server's stats hold no boot timeline ({why})", measured)
    ready_ms = float(timeline["exec_to_ready_ms"])
    start = timeline.get("start", "fresh")  # "restored": counted from the snapshot's restore
    measured.update(exec_to_ready_ms=ready_ms, start=start, pid=timeline.get("pid"))
    ok = ready_ms <= budget
    return Check("boot_budget", ok, f"{'exec' if start == 'fresh' else start + ' start'} to ready {ready_ms:.0f} ms "
                                    f"{'within' if ok else 'over'} {source} budget of {budget:.0f} ms", measured)


def run_checks(client, address: str, package: str | None, package_source: str, timeout_s: float, *,
               allow_missing_reference: bool = False, budget_ms: float | None = None) -> Report:
    """Every check, in order, against the server ``client`` talks to; never raises for a server's answer."""
    from edge.errors import EdgeError

    t0 = time.monotonic()
    deadline = t0 + timeout_s
    report = Report([], address, package, package_source)

    def not_run(*names: str, why: str) -> None:
        report.checks.extend(Check(n, None, f"not run: {why}") for n in names)

    def left() -> float:
        return max(MIN_REQUEST_S, deadline - time.monotonic())

    ready, answered = wait_ready(client, address, deadline)
    report.checks.append(ready)
    if not ready.passed:
        report.no_server = not answered
        not_run("package", "reference", "boot_budget", why="the server is not ready")
    else:
        try:
            stats = client.stats(timeout_s=left())
        except (TimeoutError, EdgeError) as exc:
            report.checks.append(Check("package", False, f"stats: {exc}"))
            not_run("reference", "boot_budget", why="no stats")
        else:
            check, manifest = check_package(stats, package, package_source)
            report.checks.append(check)
            if manifest is None:
                not_run("reference", why="the package is not the served one")
            else:
                report.checks.append(check_reference(client, manifest, allow_missing_reference, left()))
            report.checks.append(check_boot_budget(stats, manifest, budget_ms))
    report.elapsed_ms = (time.monotonic() - t0) * 1000
    return report


# ------------------------------------------------------------------ command line


def _names(report: Report) -> str:
    names = ", ".join(report.failed)
    return f"{names}; not run: {', '.join(report.not_run)}" if report.not_run else names


def _lines(report: Report) -> str:
    mark = {True: "PASS", False: "FAIL", None: "SKIP"}
    width = max(len(n) for n in CHECKS)
    out = [f"{mark[c.passed]}  {c.name:<{width}}  {c.detail}" for c in report.checks]
    verdict = "PASS" if report.passed else f"FAIL ({_names(report)})"
    out.append(f"edge selftest: {verdict}, {report.elapsed_ms / 1000:.1f} s")
    return "\n".join(out) + "\n"


def run(args, address: str, curve) -> int:
    """``edge selftest`` with a normalized ``address`` and the client's keys (edge/cli.py)."""
    from edge.ipc.client import EdgeClient

    package, source = find_package(args.package)
    client = EdgeClient(address, timeout_s=args.timeout, curve=curve)
    try:
        report = run_checks(client, address, package, source, args.timeout,
                            allow_missing_reference=args.allow_missing_reference, budget_ms=args.budget_ms)
    finally:
        client.close()
    if args.json:
        sys.stdout.write(json.dumps(report.as_dict(), indent=2, sort_keys=True, default=str) + "\n")
        if not report.passed:
            first = next(c for c in report.checks if c.passed is False)
            sys.stderr.write(f"edge selftest: FAIL ({_names(report)}): {first.name}: {first.detail}\n")
    else:
        sys.stdout.write(_lines(report))
    return report.exit_status
