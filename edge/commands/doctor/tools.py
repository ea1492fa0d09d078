"""The container tools and the snapshot: runc (which runs the bundle), CRIU (which takes and
restores snapshots, from 4.1), and whether the bundle's snapshot can be restored now.

The snapshot is judged as edge-supervise judges it before a start (``check_snapshot``: format,
dependencies, image files at their recorded sizes), from the same files, where the same rule
(edge/system/snapshot_rules.py) says it lives. A snapshot never fails doctor: any doubt about one
means a fresh start.
"""

from __future__ import annotations

import os
import platform
import re
import stat
from pathlib import Path

from edge.commands.doctor.context import BundleFacts, Context, as_dict, read_json, version_line
from edge.commands.doctor.report import Check, Verdict
from edge.system import snapshot_rules
from edge.system.snapshot_rules import SNAPSHOT_FORMAT, cpu_model

__all__ = ["check_runc", "check_criu", "check_snapshot", "snapshot_dir", "cpu_model", "CRIU_MIN"]

CRIU_MIN = (4, 1)  # snapshots: runc's checkpoint of this bundle needs CRIU 4.1 (docs/bundle.md, "CRIU")
CRIU_EDGE_BUILD = "v4.1.1-edge1"  # image/criu/build.sh's: takes "network-lock skip" (docs/snapshot.md)
CRIU_FIX = "install CRIU >= 4.1 in /usr/local/sbin (image/criu/build.sh; docs/bundle.md, \"CRIU\")"


def _why(r) -> str:
    return r.error or (r.err.strip().splitlines() or [f"exit {r.rc}"])[-1]


def check_runc(ctx: Context) -> Check:
    if not ctx.system_root:
        return Check("runc", Verdict.NA, ctx.not_here)
    path, r = ctx.runc
    needed = ctx.usable_bundle is not None
    if path is None or r is None or not r.ok:
        what = "not found on the unit's PATH" if path is None else f"{path} --version failed ({_why(r)})"
        verdict = Verdict.FAIL if needed else Verdict.WARN
        tail = ": edge.service runs the bundle with it" if needed else ""
        return Check("runc", verdict, f"runc {what}{tail}", "apt install runc (or put runc in /usr/sbin)",
                     {"path": path})
    m = re.search(r"runc version\s+(\S+)", r.out)
    version = m.group(1) if m else version_line(r.out)
    return Check("runc", Verdict.PASS, f"runc {version} ({path})", measured={"path": path, "version": version,
                                                                              "output": version_line(r.out)})


def _criu_version(text: str) -> tuple[int, ...] | None:
    m = re.search(r"Version:\s*(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def check_criu(ctx: Context) -> Check:
    if not ctx.system_root:
        return Check("criu", Verdict.NA, ctx.not_here)
    path, r = ctx.criu
    if path is None or r is None or not r.ok:
        what = "not found on the unit's PATH" if path is None else f"{path} --version failed ({_why(r)})"
        return Check("criu", Verdict.WARN, f"CRIU {what}: no snapshots, every start is a fresh boot", CRIU_FIX,
                     {"path": path})
    version = _criu_version(r.out)
    shown = ".".join(map(str, version)) if version else version_line(r.out)
    measured = {"path": path, "version": shown, "output": version_line(r.out), "edge_build": CRIU_EDGE_BUILD in r.out}
    if version is None or version[:2] < CRIU_MIN:
        return Check("criu", Verdict.WARN, f"CRIU {shown} ({path}) is older than 4.1: no snapshots, every start is a "
                                           f"fresh boot", CRIU_FIX, measured)
    lock = ("the edge build: no network lock" if measured["edge_build"]
            else "a stock build: each checkpoint locks the network (about 100 ms more per restore)")
    return Check("criu", Verdict.PASS, f"CRIU {shown} ({path}), {lock}", measured=measured)


def snapshot_dir(bundle: Path) -> Path:
    """Where edge-supervise looks for the bundle's snapshot (edge/system/snapshot_rules.py)."""
    return Path(snapshot_rules.snapshot_dir(bundle))


def _dependencies(ctx: Context, b: BundleFacts) -> dict:
    """What edge-supervise would compare now for the bundle ``b``: the bundle's part always; the
    machine's (kernel, CRIU, runc, CPU) only on the running system."""
    package = as_dict(b.meta.get("package"))
    deps = {"bundle_sha256": b.meta.get("bundle_sha256"), "bundle_path": str(b.real),
            "package_sha256": package.get("package_sha256"), "model_sha256": package.get("model_sha256"),
            "tokenizer_sha256": package.get("tokenizer_sha256")}
    if ctx.system_root:
        (_, criu), (_, runc) = ctx.criu, ctx.runc
        deps.update(kernel=platform.release(), criu=version_line(criu.out) if criu and criu.ok else "absent",
                    runc=version_line(runc.out) if runc and runc.ok else "absent", cpu=cpu_model())
    return deps


def _short(value, limit: int = 48) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_snapshot(ctx: Context) -> Check:
    b = ctx.usable_bundle
    if b is None:
        return Check("snapshot", Verdict.NA, "no bundle to read")
    snap = snapshot_dir(b.real)
    measured: dict = {"path": str(snap)}
    record, why = read_json(snap / "snapshot.json")
    fresh = (f"nothing to do: the next start is fresh and takes a new one (edge-supervise --snapshot auto); "
             f"to take it now: edge-bundle snapshot --bundle {b.path}")
    if record is None and why is None:
        return Check("snapshot", Verdict.NA, f"no snapshot at {snap}: fresh starts only (edge-supervise takes one "
                                             f"after a fresh start when CRIU >= 4.1 is installed)", measured=measured)
    if not isinstance(record, dict):
        return Check("snapshot", Verdict.WARN, why or f"{snap}/snapshot.json is not an object", fresh, measured)
    measured.update(taken=record.get("taken"), image_bytes=record.get("image_bytes"))
    if record.get("format") != SNAPSHOT_FORMAT:
        return Check("snapshot", Verdict.WARN, f"snapshot format {record.get('format')!r} at {snap}, edge-supervise "
                                               f"reads {SNAPSHOT_FORMAT}: it will start fresh", fresh, measured)
    recorded = as_dict(record.get("dependencies"))
    changed = {k: (recorded.get(k), v) for k, v in _dependencies(ctx, b).items() if recorded.get(k) != v}
    if changed:
        measured["changed"] = {k: {"snapshot": a, "now": n} for k, (a, n) in changed.items()}
        shown = "; ".join(f"{k} {_short(a)} -> {_short(n)}" for k, (a, n) in list(changed.items())[:2])
        more = f" (and {len(changed) - 2} more)" if len(changed) > 2 else ""
        return Check("snapshot", Verdict.WARN, f"stale, taken for another {shown}{more}: the next start is fresh",
                     fresh, measured)
    images = record.get("images")
    if not isinstance(images, dict) or not images:
        return Check("snapshot", Verdict.WARN, f"{snap}/snapshot.json lists no image files (a partial snapshot)",
                     fresh, measured)
    for name, size in images.items():
        path = snap / "images" / os.path.basename(name)
        try:
            st = os.stat(path)
            have = st.st_size if stat.S_ISREG(st.st_mode) else None
        except PermissionError:  # images/ is root's and the user namespace's (0750)
            return Check("snapshot", Verdict.WARN, f"{snap}/images cannot be read by this user: the images are not "
                                                   f"checked", "run edge doctor as root", measured)
        except OSError:
            have = None
        if have != size:
            return Check("snapshot", Verdict.WARN, f"image file {name} is missing or not {size} bytes (a truncated "
                                                   f"or partial snapshot)", fresh, measured)
    checked = "" if ctx.system_root else " (the machine's kernel, CRIU, runc and CPU not compared: --root)"
    mib = (record.get("image_bytes") or sum(v for v in images.values() if isinstance(v, int))) / (1 << 20)
    return Check("snapshot", Verdict.PASS, f"restorable: {len(images)} image files, {mib:.1f} MiB, taken "
                                           f"{record.get('taken')}{checked}", measured=measured)
