"""``edge doctor``: the field technician's check of a device, before and after flashing
(docs/doctor.md).

Each check gives PASS, WARN, FAIL or N/A (it does not apply to this machine: a Jetson check on
another machine, the boot of a service that is down) and, for WARN and FAIL, a one-line fix.
In this order:

=============  ============================================================================
l4t            ROOT/etc/nv_tegra_release, against the installed archive's L4T range
module         ROOT/proc/device-tree/model and compatible, against the archive's devices
nvpmodel       ROOT/var/lib/nvpmodel/status and ROOT/etc/nvpmodel.conf
clocks         cpufreq and the GPU's devfreq governors; jetson_clocks (minimum pinned at maximum)
cuda           onnxruntime's providers and torch.cuda, imported in a subprocess with a timeout
bundle         the bundle (--bundle): edge-bundle.json, config.json, its rootfs, its arch
cdi_devices    the device nodes, deferred CDI nodes and bind mounts the bundle needs
memory         ROOT/proc/meminfo MemAvailable against the package and the container's limit
runc           ``runc --version``
criu           ``criu --version``: 4.1 or later for snapshots
snapshot       the bundle's snapshot.json, dependencies and image files (edge-supervise's test)
unit           ``systemctl show UNIT``
service        the server's ``health`` and ``stats`` at the address
boot_budget    ``stats``' timeline exec_to_ready_ms against the package's selftest.boot_budget_ms
socket         the bundle's socket directory (owner the runtime's uid, 0750) and socket (0660)
install        ROOT/var/lib/edge/install.json: committed, on trial, rolled back
coldstart      the newest edge-coldstart record's verdict
=============  ============================================================================

Exit status: 0 when nothing failed (WARN and N/A allowed), 1 when a check failed, 2 for a
usage error. Doctor runs whether the service is up or not and never hangs: every command and
every request has a timeout. It never stops at a check's own error: that check says so.

Imported by ``edge``'s parser: standard library only at module level.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

__all__ = ["CHECKS", "DEVICE_BUNDLE", "UsageError", "add_arguments", "run", "run_checks", "make_context"]

CHECKS = ("l4t", "module", "nvpmodel", "clocks", "cuda", "bundle", "cdi_devices", "memory", "runc", "criu",
          "snapshot", "unit", "service", "boot_budget", "socket", "install", "coldstart")
DEVICE_BUNDLE = "/opt/edge/bundle/current"  # edge.service's bundle (EnvironmentFile may name another)
DEFAULT_TIMEOUT_S = 5.0  # one request's wait when the parser gives no --timeout (s)


def add_arguments(p) -> None:
    """``edge doctor``'s own options (``--connect``, ``--timeout`` and the keys come from edge/cli.py)."""
    p.add_argument("--json", action="store_true", help="print one JSON document (checks with name, verdict, detail, "
                                                       "fix, measured; a summary) instead of a table")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="the device's root: its files (etc/nv_tegra_release, proc/, var/lib/edge, the bundle's "
                        "socket directory and device nodes) are read under DIR; a root other than / runs and asks "
                        "nothing of this machine (default /)")
    p.add_argument("--bundle", metavar="DIR", default=None,
                   help=f"the bundle to check (default: {DEVICE_BUNDLE} under --root)")
    p.add_argument("--unit", metavar="NAME", default="edge", help="the systemd unit that runs it (default edge)")
    p.add_argument("--package", metavar="DIR", default=None,
                   help="the package whose selftest.boot_budget_ms is the boot budget (default: the bundle's)")
    from edge.config.argtypes import positive_number

    p.add_argument("--budget-ms", type=positive_number("ms"), default=None, metavar="MS",
                   help="boot budget, exec to ready in ms (default: the package's, else 1500)")
    p.add_argument("--coldstart", metavar="PATH", default=None,
                   help="an edge-coldstart record, or a directory of them, whose newest verdict is reported "
                        "(default: /var/cache/edge/coldstart/*.json under --root, and ./edge-coldstart*.json)")


class UsageError(ValueError):
    """A setting that cannot work; exit status 2."""


def make_context(args, address: str | None, curve, host=None):
    """The :class:`~edge.commands.doctor.context.Context` of ``args``; UsageError for a root or bundle that
    is not there."""
    from edge.commands.doctor.context import Context, load_bundle

    root = Path(args.root)
    if not os.path.isdir(root):
        raise UsageError(f"--root {root}: not a directory")
    bundle_path = Path(args.bundle) if args.bundle else root / DEVICE_BUNDLE.lstrip("/")
    bundle = load_bundle(bundle_path)
    if args.bundle and (bundle is None or bundle.error):
        raise UsageError(f"--bundle {bundle_path}: {bundle.error if bundle else 'no such directory'}")
    system_root = os.path.realpath(root) == "/"
    if address is not None:
        source = "--connect"
    elif bundle is not None and not bundle.error and str(bundle.meta.get("address") or ""):
        address, source = str(bundle.meta["address"]), f"{bundle.path}/edge-bundle.json"
        if address.startswith("ipc://") and not address.startswith("ipc://@"):  # a host path: under the root
            address = "ipc://" + str(root / address[len("ipc://"):].lstrip("/"))
    elif system_root:
        from edge.ipc.endpoint import default_address

        address, source = default_address(), "the default (EDGE_ADDRESS, else the runtime directory's)"
    else:
        source = "none: not the running system, and no bundle names one"
    if getattr(args, "package", None) and not os.path.isfile(Path(args.package, "manifest.json")):
        raise UsageError(f"--package {args.package}: no manifest.json there")
    return Context(root, bundle, bundle_path, address, source, host=host, unit=args.unit,
                   timeout_s=getattr(args, "timeout", None) or DEFAULT_TIMEOUT_S, curve=curve,
                   package=Path(args.package) if getattr(args, "package", None) else None,
                   budget_ms=getattr(args, "budget_ms", None),
                   coldstart=Path(args.coldstart) if getattr(args, "coldstart", None) else None)


def _table():
    from edge.commands.doctor import bundle, device, records, service, tools

    return {"l4t": device.check_l4t, "module": device.check_module, "nvpmodel": device.check_nvpmodel,
            "clocks": device.check_clocks, "cuda": device.check_cuda, "bundle": bundle.check_bundle,
            "cdi_devices": bundle.check_cdi_devices, "memory": bundle.check_memory, "runc": tools.check_runc,
            "criu": tools.check_criu, "snapshot": tools.check_snapshot, "unit": service.check_unit,
            "service": service.check_service, "boot_budget": service.check_boot_budget,
            "socket": bundle.check_socket, "install": records.check_install, "coldstart": records.check_coldstart}


def run_checks(ctx):
    """Every check of :data:`CHECKS`, in order; a check that raises is reported, never raised."""
    import threading

    from edge.commands.doctor.report import Check, Report, Verdict

    t0 = time.monotonic()
    if ctx.system_root:  # the engines' imports take seconds (torch): they run while the other checks do,
        threading.Thread(target=lambda: ctx.engines, daemon=True).start()
    table = _table()
    done = {}
    for name in [n for n in CHECKS if n != "cuda"] + ["cuda"]:  # and the check that waits for them comes last
        try:
            done[name] = table[name](ctx)
        except Exception as exc:  # noqa: BLE001 - one check's bug must not cost the others
            done[name] = Check(name, Verdict.WARN, f"the check itself failed: {type(exc).__name__}: {exc}",
                               "report it as a bug of edge doctor, with this line")
    b = ctx.bundle
    return Report([done[n] for n in CHECKS], str(ctx.root), str(b.path) if b is not None else None, ctx.address,
                  ctx.address_source, ctx.unit, (time.monotonic() - t0) * 1000)


def run(args, address: str | None, curve, *, host=None) -> int:
    """``edge doctor`` with ``address`` (``--connect``, normalized; None: the bundle's, else the
    default) and the client's keys (edge/cli.py); ``host``: the machine's commands (tests)."""
    from edge.commands.doctor.report import render_json, render_table

    try:
        ctx = make_context(args, address, curve, host)
        report = run_checks(ctx)
        text = render_json(report) if args.json else render_table(report)
    except UsageError as exc:
        sys.stderr.write(f"edge doctor: {exc}\n")
        return 2
    except Exception as exc:  # noqa: BLE001 - never a traceback: one line, and a failure
        sys.stderr.write(f"edge doctor: failed: {type(exc).__name__}: {exc}\n")
        return 1
    sys.stdout.write(text)
    return report.exit_status
