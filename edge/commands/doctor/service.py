"""The service: the systemd unit's state, the server's answer, and its last boot against the
package's budget (the ``timeline`` of ``stats``, as ``edge selftest`` reads it)."""

from __future__ import annotations

from edge.commands.doctor.context import Context, read_json
from edge.commands.doctor.report import Check, Verdict

__all__ = ["check_unit", "check_service", "check_boot_budget"]


def _unit_active(ctx: Context) -> bool:
    props, _ = ctx.unit_state if ctx.system_root else (None, None)
    return props is not None and props.get("ActiveState") == "active"


def check_unit(ctx: Context) -> Check:
    if not ctx.system_root:
        return Check("unit", Verdict.NA, ctx.not_here)
    props, why = ctx.unit_state
    if props is None:  # then why says why (unit_state)
        return Check("unit", Verdict.NA, why or "the unit's state cannot be read here")
    u = ctx.unit
    state, sub, result = props.get("ActiveState"), props.get("SubState"), props.get("Result")
    restarts = int(props["NRestarts"]) if (props.get("NRestarts") or "").isdigit() else 0
    measured = {k: props.get(k) for k in ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus",
                                          "UnitFileState")} | {"NRestarts": restarts}
    journal = f"journalctl -u {u} -b -n 50"
    if props.get("LoadState") == "not-found":
        return Check("unit", Verdict.WARN, f"{u}.service is not installed",
                     "install systemd/edge.service and edge-supervise (docs/bundle.md, \"Install\")", measured)
    text = f"{u}.service {state} ({sub}), result {result}, {restarts} restarts"
    if state == "failed":
        return Check("unit", Verdict.FAIL, text, f"{journal}; then systemctl reset-failed {u} && systemctl start {u}",
                     measured)
    if state == "active" and restarts:
        return Check("unit", Verdict.WARN, f"{text}: it crashed or hung since it was started", journal, measured)
    if state == "active":
        enabled = "" if props.get("UnitFileState") in (None, "enabled") else f"; {props.get('UnitFileState')}"
        return Check("unit", Verdict.PASS, text + enabled, measured=measured)
    if state == "inactive":
        return Check("unit", Verdict.WARN, f"{text}: the service is stopped",
                     f"systemctl enable --now {u}" if props.get("UnitFileState") != "enabled"
                     else f"systemctl start {u}", measured)
    return Check("unit", Verdict.WARN, f"{text}: not settled yet", f"wait, then run edge doctor again; {journal}",
                 measured)


def check_service(ctx: Context) -> Check:
    server = ctx.server
    if server is None:
        return Check("service", Verdict.NA, ctx.not_here)
    measured: dict = {"address": server.address, "address_source": ctx.address_source}
    if not server.answered:
        measured["error"] = server.error
        if server.denied:
            return Check("service", Verdict.WARN, f"cannot ask the server at {server.address}: {server.error}",
                         "run edge doctor as root, or as a member of the socket's group (the host's apps)", measured)
        if _unit_active(ctx):
            return Check("service", Verdict.FAIL, f"{ctx.unit}.service is active and nothing answers at "
                                                  f"{server.address} ({server.error})",
                         f"journalctl -u {ctx.unit} -b -n 50; systemctl restart {ctx.unit}", measured)
        return Check("service", Verdict.NA, f"service down: nothing answers at {server.address} ({server.error})",
                     measured=measured)
    health = server.health or {}
    lineage = (server.stats or {}).get("lineage") or {}
    measured.update(state=health.get("state"), ready=health.get("ready"), uptime_s=health.get("uptime_s"),
                    lineage=lineage)
    if not server.ready:
        return Check("service", Verdict.WARN, f"the server at {server.address} answers, state "
                                              f"{health.get('state')}: not ready",
                     f"wait for it (edge health --connect {server.address}); journalctl -u {ctx.unit} -f", measured)
    served = f"{lineage.get('model')} on {lineage.get('engine')}/{lineage.get('device')}"
    text = f"ready at {server.address}: {served}, up {health.get('uptime_s') or 0:.0f} s"
    b = ctx.usable_bundle
    want = ((b.meta.get("package") or {}).get("package_sha256") if b else None)
    if b is not None and want and lineage.get("package_sha256") and lineage["package_sha256"] != want:
        return Check("service", Verdict.WARN, f"{text}; it runs package {lineage['package_sha256'][:12]}, the bundle "
                                              f"at {b.path} holds {want[:12]}",
                     f"systemctl restart {ctx.unit} (a bundle switched without a restart)", measured)
    if server.stats is None:
        return Check("service", Verdict.WARN, f"{text}; stats failed: {server.error}",
                     f"journalctl -u {ctx.unit} -b -n 50", measured)
    return Check("service", Verdict.PASS, text, measured=measured)


def _budget(ctx: Context) -> tuple[float, str]:
    """The boot budget (ms) and whose it is: --budget-ms, the package's, else edge's default."""
    if ctx.budget_ms is not None:
        return ctx.budget_ms, "--budget-ms"
    manifest = None
    if ctx.package is not None:
        manifest, _ = read_json(ctx.package / "manifest.json")
    elif ctx.usable_bundle is not None:
        manifest = ctx.usable_bundle.manifest
    selftest = manifest.get("selftest") if isinstance(manifest, dict) else None
    if isinstance(selftest, dict) and isinstance(selftest.get("boot_budget_ms"), (int, float)):
        return float(selftest["boot_budget_ms"]), "the package's"
    from edge.preload.manifest import DEFAULT_BOOT_BUDGET_MS

    return DEFAULT_BOOT_BUDGET_MS, "the default"


def check_boot_budget(ctx: Context) -> Check:
    server = ctx.server
    if server is None or not server.answered:
        why = ctx.not_here if server is None else (
            "the server could not be asked (permission)" if server.denied else "service down: no boot to measure")
        return Check("boot_budget", Verdict.NA, why)
    budget, source = _budget(ctx)
    measured: dict = {"budget_ms": budget, "budget_source": source}
    timeline = (server.stats or {}).get("timeline")
    if not isinstance(timeline, dict) or timeline.get("exec_to_ready_ms") is None:
        error = (timeline or {}).get("error") if isinstance(timeline, dict) else None
        return Check("boot_budget", Verdict.WARN, f"the server reports no boot timeline ({error or 'none in stats'})",
                     "start the runtime with its timeline on (edge serve --timeline, the bundle's default)", measured)
    ready_ms = float(timeline["exec_to_ready_ms"])
    start = timeline.get("start", "fresh")
    stages = [s for s in timeline.get("stages") or [] if isinstance(s, dict) and "duration_ms" in s]
    slowest = max(stages, key=lambda s: s["duration_ms"], default=None)
    measured.update(exec_to_ready_ms=ready_ms, start=start, pid=timeline.get("pid"),
                    slowest_stage=slowest and {"stage": slowest.get("stage"), "ms": slowest["duration_ms"]})
    what = "exec" if start == "fresh" else f"{start} start"
    slow = f"; slowest stage {slowest.get('stage')} {slowest['duration_ms']:.0f} ms" if slowest else ""
    if ready_ms <= budget:
        return Check("boot_budget", Verdict.PASS, f"{what} to ready {ready_ms:.0f} ms, within {source} budget of "
                                                  f"{budget:.0f} ms{slow}", measured=measured)
    return Check("boot_budget", Verdict.FAIL, f"{what} to ready {ready_ms:.0f} ms, over {source} budget of "
                                              f"{budget:.0f} ms{slow}",
                 "read the stages (edge stats: timeline); check the nvpmodel and clocks rows; a snapshot start "
                 "(CRIU >= 4.1) skips the imports; edge selftest fails this boot too", measured)
