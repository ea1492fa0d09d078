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
4. ``boot_budget``: the boot's ``exec_to_ready_ms`` (``stats``' timeline) is within its budget:
   the package's ``selftest.boot_budget_ms`` for a restored start, and for a fresh start where a
   snapshot can be taken (the device's starts restore: this one should have); the package's
   ``selftest.fresh_boot_budget_ms`` of the served engine for a fresh start where none can be
   (:func:`snapshot_verdict`: ``--snapshots``, else edge-supervise's start record). The check says
   which start it judged and against which budget.

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

__all__ = ["CHECKS", "DEVICE_PACKAGE", "START_RECORD", "Check", "Report", "SnapshotVerdict", "add_arguments",
           "find_package", "snapshot_verdict", "run", "run_checks"]

CHECKS = ("ready", "package", "reference", "boot_budget")
# The package of the installed bundle, seen from the host (the container sees it at
# /opt/edge/package; image/bundle/rootfs.py PACKAGE_PATH): where the updater's gate runs.
DEVICE_PACKAGE = "/opt/edge/bundle/current/rootfs/opt/edge/package"
POLL_S = 0.1  # between health probes while the server is not up yet (s)
PROBE_TIMEOUT_S = 2.0  # one health probe's wait (s); health is answered in ms, even under load
MIN_REQUEST_S = 1.0  # least wait given to stats and infer once ready, even with --timeout nearly spent (s)
# edge-supervise's record of the unit's start (edge/supervise/start_record.py, RuntimeDirectory=edge-supervise
# in systemd/edge.service): whether it restored, and what became of its snapshot.
START_RECORD = "/run/edge-supervise/start.json"


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
                   help="boot budget, exec to ready in ms, whichever start is judged (default: the package's "
                        "selftest.boot_budget_ms, else 1500; for a fresh start where no snapshot can be taken, "
                        "its selftest.fresh_boot_budget_ms of the served engine)")
    p.add_argument("--fresh-budget-ms", type=positive_number("ms"), default=None, metavar="MS",
                   help="the fresh start's budget where no snapshot can be taken (default: the package's "
                        "selftest.fresh_boot_budget_ms of the served engine, else its boot budget)")
    p.add_argument("--snapshots", choices=("auto", "yes", "no"), default="auto",
                   help="whether snapshots of the runtime can be taken on this device, which decides the budget "
                        "of a fresh start: yes: the package's boot budget, as for a restored start; no: its fresh "
                        f"budget; auto: what edge-supervise's start record says ({START_RECORD}; --start-record), "
                        "and no where there is none (a server started by hand)")
    p.add_argument("--start-record", metavar="FILE", default=START_RECORD,
                   help="edge-supervise's start record, read by --snapshots auto")


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


@dataclass
class SnapshotVerdict:
    """Whether a snapshot of the runtime can be taken on this device, and how that is known."""

    possible: bool
    why: str  # one clause for a person: what said so


def snapshot_verdict(address: str, record_path: str = START_RECORD) -> SnapshotVerdict:
    """What edge-supervise's start record says of snapshots for the server at ``address``: one was
    restored, is being taken or was taken (possible); ``--snapshot off`` or a failed one (not
    possible, with its error); no record, or one of another server (not possible: nothing here
    takes snapshots of this server)."""
    try:
        with open(record_path) as f:
            record = json.load(f)
    except FileNotFoundError:
        return SnapshotVerdict(False, f"no edge-supervise start record at {record_path}: nothing takes snapshots "
                                      f"of this server")
    except (OSError, ValueError) as exc:
        return SnapshotVerdict(False, f"edge-supervise's start record {record_path} is unreadable ({exc})")
    if not isinstance(record, dict) or record.get("address") != address:
        other = record.get("address") if isinstance(record, dict) else None
        return SnapshotVerdict(False, f"edge-supervise's start record {record_path} is of another server ({other})")
    snap = record.get("snapshot")
    if record.get("start") == "restored":
        return SnapshotVerdict(True, "edge-supervise restored this start from a snapshot")
    if snap == "off":
        return SnapshotVerdict(False, "edge-supervise runs with --snapshot off (the unit's snapshot setting, "
                                      "/etc/default/edge)")
    if snap == "failed":
        return SnapshotVerdict(False, f"edge-supervise could not take one: {record.get('snapshot_error', '?')}")
    if snap in ("taking", "taken"):
        why = f"; this start was not restored: {record['not_restored']}" if record.get("not_restored") else ""
        return SnapshotVerdict(True, f"edge-supervise {'is taking' if snap == 'taking' else 'took'} one after this "
                                     f"fresh start{why}")
    return SnapshotVerdict(False, f"edge-supervise's start record says snapshot {snap!r}")


def check_boot_budget(stats: dict, manifest, budget_ms: float | None, *, fresh_budget_ms: float | None = None,
                      snapshots: SnapshotVerdict | None = None, address: str = "",
                      start_record: str = START_RECORD) -> Check:
    """The boot's exec-to-ready time (stats' timeline) against its budget: the package's boot
    budget for a restored start and for a fresh one where a snapshot can be taken (``snapshots``,
    else :func:`snapshot_verdict`), the served engine's fresh budget for a fresh one where none can."""
    from edge.preload.manifest import DEFAULT_BOOT_BUDGET_MS

    ref = manifest.selftest if manifest is not None else None
    restored_budget, restored_source = ((ref.boot_budget_ms, "the package's") if ref is not None
                                        else (DEFAULT_BOOT_BUDGET_MS, "the default"))
    engine = (stats.get("lineage") or {}).get("engine")
    fresh_named = True
    if fresh_budget_ms is not None:
        fresh_budget, fresh_source = fresh_budget_ms, "--fresh-budget-ms"
    elif ref is not None and ref.fresh_budget(engine) is not None:
        fresh_budget, fresh_source = ref.fresh_budget(engine), "the package's"
    else:  # a package built before the fresh budget, or for no such engine: the one budget holds
        fresh_budget, fresh_source, fresh_named = restored_budget, restored_source, False
    measured = {"budget_ms": restored_budget, "budget_source": restored_source, "boot_budget_ms": restored_budget,
                "fresh_boot_budget_ms": fresh_budget, "fresh_budget_source": fresh_source, "engine": engine}
    timeline = stats.get("timeline")
    if not isinstance(timeline, dict) or timeline.get("exec_to_ready_ms") is None:
        why = timeline.get("error") if isinstance(timeline, dict) and timeline.get("error") else "none reported"
        return Check("boot_budget", False, f"the server's stats hold no boot timeline ({why})", measured)
    ready_ms = float(timeline["exec_to_ready_ms"])
    start = timeline.get("start", "fresh")  # "restored": counted from the snapshot's restore
    measured.update(exec_to_ready_ms=ready_ms, start=start, pid=timeline.get("pid"), judged=start)
    if start == "restored":
        budget, source, name = restored_budget, restored_source, "budget"
        why = "a restored start" + (f"; {fresh_source} fresh-start budget for {engine}: {fresh_budget:.0f} ms"
                                    if fresh_named else "")
        measured["snapshot_possible"] = True
    else:
        verdict = snapshots or snapshot_verdict(address, start_record)
        measured.update(snapshot_possible=verdict.possible, snapshot_why=verdict.why)
        if verdict.possible:
            budget, source, name = restored_budget, restored_source, "budget"
            why = (f"a fresh start, held to the restored start's budget where a snapshot can be taken: "
                   f"{verdict.why}; its fresh budget ({fresh_budget:.0f} ms) holds only where none can")
        else:
            budget, source, name = fresh_budget, fresh_source, "fresh-start budget" if fresh_named else "budget"
            why = f"a fresh start where no snapshot can be taken: {verdict.why}" + (
                "" if fresh_named else f"; the package names no fresh-start budget for {engine}")
    if budget_ms is not None:
        budget, source, name = budget_ms, "--budget-ms", "budget"
    measured.update(budget_ms=budget, budget_source=source,
                    budget="--budget-ms" if budget_ms is not None else
                    "fresh_boot_budget_ms" if fresh_named and name == "fresh-start budget" else "boot_budget_ms")
    ok = ready_ms <= budget
    what = "exec to ready" if start == "fresh" else f"{start} start to ready"
    of = f" for {engine}" if name == "fresh-start budget" and source == "the package's" and engine else ""
    detail = f"{what} {ready_ms:.0f} ms {'within' if ok else 'over'} {source} {name} of {budget:.0f} ms{of}"
    return Check("boot_budget", ok, f"{detail} ({why})", measured)


def run_checks(client, address: str, package: str | None, package_source: str, timeout_s: float, *,
               allow_missing_reference: bool = False, budget_ms: float | None = None,
               fresh_budget_ms: float | None = None, snapshots: SnapshotVerdict | None = None,
               start_record: str = START_RECORD) -> Report:
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
            report.checks.append(check_boot_budget(stats, manifest, budget_ms, fresh_budget_ms=fresh_budget_ms,
                                                   snapshots=snapshots, address=address, start_record=start_record))
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
        snapshots = None if args.snapshots == "auto" else SnapshotVerdict(
            args.snapshots == "yes", f"--snapshots {args.snapshots}")
        report = run_checks(client, address, package, source, args.timeout,
                            allow_missing_reference=args.allow_missing_reference, budget_ms=args.budget_ms,
                            fresh_budget_ms=args.fresh_budget_ms, snapshots=snapshots,
                            start_record=args.start_record)
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
