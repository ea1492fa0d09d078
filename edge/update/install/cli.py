"""The device's subcommands of ``edge-bundle``: install, status, rollback, mark-good.

``image/build_bundle.py`` registers them with :func:`add_parsers` and runs :func:`command`.
Building the parsers imports nothing heavy (pydantic, cryptography load when a command runs),
so ``edge-bundle build`` does not pay for them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from edge.config.argtypes import number

__all__ = ["COMMANDS", "CRASH_POINTS", "EPILOG", "add_parsers", "command"]

COMMANDS = ("install", "status", "rollback", "mark-good")
# Points after a step where `install --crash-at` SIGKILLs the installer (tests of a killed install).
CRASH_POINTS = ("after-verify", "mid-unpack", "after-unpack", "after-rename", "after-switch", "after-state")

EPILOG = """\
exit status of install: 0 installed (and the unit restarted, or the restart skipped); 1 refused: the
archive fails a check (signature, manifest, compatibility, space, a member), nothing is left
behind and the live slot is untouched; 2 not ready: no such file, no trusted key, current is not
edge-bundle's symlink, another installer is running; 3 failed midway (the message says what is
left; current still points at a complete slot); 4 installed and switched, but the restart failed
(the new slot is on trial: edge-trial rolls it back if the unit keeps failing, docs/update.md).
rollback and mark-good: 0 done; 2 nothing to do it to; 3 failed; 4 (rollback) the restart failed.
status: 0 committed; 1 on trial; 2 rolled back, or broken (nothing installed, current missing or
not a slot, the live slot incomplete). 130 interrupted, 143 terminated."""


_bytes = number(int, "a number of bytes", ok=lambda n: n >= 0, rule="a number of bytes >= 0")


def _root(p) -> None:
    p.add_argument("--root", type=Path, default=Path("/"),
                   help="the device's root directory (a test root, or a rootfs being prepared for flashing)")


def _unit(p) -> None:
    p.add_argument("--unit", default="edge", metavar="NAME",
                   help="the runtime's systemd unit, without .service (default: edge)")


def add_parsers(sub) -> None:
    i = sub.add_parser("install", epilog=EPILOG,
                       help="verify a signed .edgebundle, unpack it into the inactive slot, switch current to it")
    i.add_argument("archive", type=Path, metavar="FILE", help="the archive (edge-bundle pack --out)")
    _root(i)
    i.add_argument("--no-restart", action="store_true",
                   help="do not restart edge.service (also skipped when --root is not /)")
    _unit(i)
    i.add_argument("--no-snapshot", action="store_true",
                   help="take no snapshot of the new bundle before the switch (default: boot it to its snapshot "
                        "point in a staging container while the old runtime serves, and checkpoint it, so that its "
                        "first start restores; docs/update.md)")
    i.add_argument("--crash-at", choices=CRASH_POINTS, default=None, metavar="STEP",
                   help=f"tests only: SIGKILL the installer after STEP ({', '.join(CRASH_POINTS)})")
    i.add_argument("--assume-free", type=_bytes, default=None, metavar="BYTES",
                   help="tests only: take BYTES as the free space of the slots' file system instead of statvfs")
    s = sub.add_parser("status", epilog=EPILOG,
                       help="the live slot, the other one, the trial and the history (exit 0 committed, 1 on trial, "
                            "2 rolled back or broken)")
    _root(s)
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    r = sub.add_parser("rollback", epilog=EPILOG, help="switch current back to the previous slot (reason: manual)")
    _root(r)
    r.add_argument("--no-restart", action="store_true",
                   help="do not restart edge.service (also skipped when --root is not /)")
    _unit(r)
    m = sub.add_parser("mark-good", epilog=EPILOG,
                       help="commit the live slot: end its trial (or acknowledge a rollback)")
    _root(m)


def _say(msg: str) -> None:
    print(msg)


def command(args) -> int:
    from edge.update.install.errors import InstallError, Refused
    from edge.update.install.layout import DeviceLayout

    prog = f"edge-bundle {args.command}"
    layout = DeviceLayout(args.root)
    try:
        if args.command == "install":
            return _install(args, layout)
        if args.command == "status":
            return _status(args, layout)
        if args.command == "rollback":
            return _rollback(args, layout)
        return _mark_good(layout)
    except Refused as exc:
        print(f"{prog}: refused ({exc.kind}): {exc}; nothing was installed, the live slot is unchanged",
              file=sys.stderr)
        return exc.exit_code
    except InstallError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # midway: the disk, a permission; the message names the path
        after = "" if args.command == "status" else (
            "; current still points at a complete slot (`edge-bundle status` says which)")
        print(f"{prog}: failed: {exc}{after}", file=sys.stderr)
        return 3


def _install(args, layout) -> int:
    from edge.update.install.installer import install

    report = install(args.archive, layout, restart=not args.no_restart, crash_at=args.crash_at,
                     assume_free=args.assume_free, unit=args.unit, snapshot=not args.no_snapshot)
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    m, st, t = report.manifest, report.stats, report.timings
    total = sum(v for k, v in t.items() if k != "restart")
    snap = f", snapshot {t['snapshot']:.2f} s" if "snapshot" in t else ""
    _say(f"installed {args.archive.name} into slot {report.slot}: bundle {m.bundle_sha256[:12]} (edge {m.edge_version}, "
         f"{m.engine}), {st.files} files, {st.bytes / (1 << 20):.1f} MiB in {total:.2f} s "
         f"(verify {t['verify']:.2f} s, unpack {t['unpack']:.2f} s, fs-verity {t['fsverity']:.2f} s{snap}, "
         f"switch {t['switch']:.2f} s)")
    staged = report.staged
    if staged is not None:
        _say(f"snapshot: {staged.detail}" if staged.taken else
             f"snapshot: none, the first start is fresh: {staged.detail}")
        _say("snapshot record: " + json.dumps(staged.as_dict(), sort_keys=True))
    else:
        _say("snapshot skipped (--no-snapshot)" if args.no_snapshot else
             f"snapshot skipped (--root {args.root} is not this system's root)")
    back = f"; rollback goes to slot {report.previous}" if report.previous else ""
    _say(f"current -> slot {report.slot}, on trial{back}")
    _say(report.restart)
    return 0


def _status(args, layout) -> int:
    from edge.update.install.status import render_json, render_text, status

    report = status(layout)
    print(render_json(report) if args.json else render_text(report))
    return report["exit_code"]


def _rollback(args, layout) -> int:
    from edge.update.install.installer import rollback

    left, now_live, restarted = rollback(layout, restart=not args.no_restart, unit=args.unit)
    _say(f"rolled back: current -> slot {now_live} (was slot {left}); reason: manual")
    _say(restarted)
    return 0


def _mark_good(layout) -> int:
    from edge.update.install.installer import mark_good

    slot, what = mark_good(layout)
    _say(f"slot {slot}: {what}")
    return 0
