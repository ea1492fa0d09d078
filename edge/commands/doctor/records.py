"""What earlier tools left on the device: the installer's state (``edge-bundle status``'s data)
and the newest ``edge-coldstart`` record.

The state is read as plain JSON, not through edge/update/install/state.py's models: doctor reports a
state the installer would refuse instead of stopping at it.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from edge.commands.doctor.context import Context, as_dict, read_json
from edge.commands.doctor.report import Check, Verdict

__all__ = ["check_install", "check_coldstart", "coldstart_records", "COLDSTART_DIR"]

# Where doctor looks for edge-coldstart records (edge-coldstart --json FILE writes one; its default
# is ./edge-coldstart-<mode>-<engine>-<cache>.json): the device's cache, beside the bundles
# edge-coldstart --snapshot builds there (bench/coldstart/default_bundle.py ROOT).
COLDSTART_DIR = "/var/cache/edge/coldstart"
MAX_RECORDS = 200  # JSON files read at most: a directory of thousands is not a history of ours


def check_install(ctx: Context) -> Check:
    path = ctx.path("/var/lib/edge/install.json")
    state, why = read_json(path)
    measured: dict = {"path": str(path)}
    if state is None and why is None:
        return Check("install", Verdict.NA, f"not installed by edge-bundle install (no {path})", measured=measured)
    if not isinstance(state, dict):
        return Check("install", Verdict.WARN, why or f"{path} is not a JSON object",
                     "edge-bundle status (it rebuilds the state from the slots)", measured)
    trial = state.get("trial") if isinstance(state.get("trial"), dict) else None
    slots = as_dict(state.get("slots"))
    live = state.get("live")
    record = as_dict(slots.get(live))
    measured.update(live=live, previous=state.get("previous"), trial=trial,
                    bundle_sha256=record.get("bundle_sha256"))
    what = f"slot {live} (bundle {str(record.get('bundle_sha256') or '?')[:12]}, {record.get('package') or '?'})"
    current = ctx.path("/opt/edge/bundle/current")
    try:
        target = os.readlink(current)
    except OSError:
        target = None
    if live and target is not None and f"/slots/{live}/" not in f"/{target}/":
        return Check("install", Verdict.WARN, f"the state says {what} is live, {current} points at {target}",
                     "edge-bundle status (it brings the state level with the disk)", measured)
    if trial is None:
        return Check("install", Verdict.NA, f"{path} records no install yet", measured=measured)
    status = trial.get("status")
    if status == "committed":
        return Check("install", Verdict.PASS, f"{what} committed {trial.get('since')}", measured=measured)
    if status == "on_trial":
        return Check("install", Verdict.WARN, f"{what} on trial since {trial.get('since')}, {trial.get('tries_left')} "
                                              f"of {trial.get('tries')} tries left",
                     "edge-trial commits it once edge selftest passes for a while; edge-bundle mark-good commits it "
                     "by hand, edge-bundle rollback undoes it (docs/update.md)", measured)
    if status == "rolled_back":
        return Check("install", Verdict.WARN, f"an update was rolled back to {what} {trial.get('since')}: "
                                              f"{trial.get('reason') or 'no reason recorded'}",
                     "edge-bundle status shows the history; fix the cause, then install the update again", measured)
    return Check("install", Verdict.WARN, f"{path}: unknown trial status {status!r}",
                 "edge-bundle status (it rebuilds the state from the slots)", measured)


def coldstart_records(ctx: Context) -> tuple[list[Path], list[str]]:
    """(candidate files, the places looked in): --coldstart's file or directory, else the device's
    directory and, on the running system, edge-coldstart's default names in the current one."""
    if ctx.coldstart is not None:
        places = [str(ctx.coldstart)]
        if os.path.isdir(ctx.coldstart):
            return sorted(Path(p) for p in glob.glob(os.path.join(ctx.coldstart, "*.json")))[:MAX_RECORDS], places
        return [ctx.coldstart], places
    places = [str(ctx.path(COLDSTART_DIR))]
    files = [Path(p) for p in glob.glob(os.path.join(places[0], "*.json"))]
    if ctx.system_root:
        places.append(os.getcwd())
        files += [Path(os.path.abspath(p)) for p in glob.glob("edge-coldstart*.json")]
    return sorted(set(files))[:MAX_RECORDS], places


def check_coldstart(ctx: Context) -> Check:
    files, places = coldstart_records(ctx)
    found: list[tuple[str, float, Path, dict]] = []  # (started_at, mtime, file, record)
    for f in files:
        record, _ = read_json(f)
        if isinstance(record, dict) and record.get("tool") == "edge-coldstart" \
                and isinstance(record.get("summary"), dict):
            found.append((str(record.get("started_at") or ""), os.path.getmtime(f), f, record))
    if not found:
        return Check("coldstart", Verdict.NA, f"no edge-coldstart record in {', '.join(places)}",
                     measured={"looked_in": places})
    started, _, path, record = max(found, key=lambda t: (t[1], t[0]))
    s, config = record["summary"], as_dict(record.get("config"))
    measured = {"record": str(path), "started_at": started, "pass": s.get("pass"), "verdict": s.get("verdict"),
                "median_ms": s.get("median_ms"), "budget_ms": s.get("budget_ms"), "config": config,
                "records_found": len(found)}
    lineage = (record.get("package") or {}).get("lineage") or {}
    b = ctx.usable_bundle
    want = ((b.meta.get("package") or {}).get("package_sha256") if b else None)
    other = (", for another package than the bundle's" if want and lineage.get("package_sha256")
             and lineage["package_sha256"] != want else "")
    text = (f"{s.get('verdict')} ({config.get('mode')}, {config.get('engine')}, {config.get('cache')} cache, "
            f"{s.get('runs')} runs, {started or 'undated'}{other}; {path})")
    if s.get("pass") is True:
        return Check("coldstart", Verdict.PASS, text, measured=measured)
    return Check("coldstart", Verdict.WARN, text, "read the record's phases; fix, then run edge-coldstart again "
                                                  f"(--json {COLDSTART_DIR}/NAME.json keeps it where doctor looks)",
                 measured)
