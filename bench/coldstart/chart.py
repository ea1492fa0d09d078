"""PNG chart of every run's phase timeline (matplotlib, an optional extra: `pip install edge[plot]`)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_chart"]

# bench/coldstart/unit_runs.py UNIT_PHASES (not imported: it would load the client, zmq and msgpack)
UNIT_PHASES = ("stop", "systemd_to_supervisor", "supervisor_to_runc", "runc_to_exec", "runtime_boot",
               "ready_to_reply")


def _rows(runs: list[tuple[int, dict]]) -> list[tuple[str, list, list]]:
    """(label, serial phases, overlapped phases) of (run number, run); each phase (name, start_ms, end_ms)."""
    rows = []
    for i, run in runs:
        overlapped = {s["stage"] for s in (run.get("timeline") or {}).get("stages") or [] if s.get("overlapped")}
        unit = run.get("kind") == "unit"  # --unit: the service's phases on the bar, the runtime's stages under it
        serial, side = [], []
        for name, span in (run.get("phases") or {}).items():
            if not span:
                continue
            beside = name not in UNIT_PHASES if unit else name in overlapped
            (side if beside else serial).append((name, span[0], span[1]))
        rows.append((f"run {i}  {run['total_ms']:.0f} ms", serial, side))
    return rows


def write_chart(record: dict, path: Path) -> str | None:
    """Write the chart; returns None, or a note saying why no chart was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'edge[plot]'): no chart written"
    groups = [(k, [(p["i"], p[k]) for p in record["runs"] if p.get(k)])
              for k in ("runtime", "fresh", "floor", "baseline", "import_torch")]
    groups = [(k, runs) for k, runs in groups if runs]
    if not groups:
        return "no successful run to chart"
    names: list[str] = []
    for _, runs in groups:
        for _, serial, side in _rows(runs):
            for n, _, _ in serial + side:
                if n not in names:
                    names.append(n)
    # tab20 then tab20b: a restore's stages and a fresh boot's together are more than 20 names
    palette = [*plt.get_cmap("tab20").colors, *plt.get_cmap("tab20b").colors]
    colour = {n: palette[i % len(palette)] for i, n in enumerate(names)}
    heights = [max(2.0, 0.45 * len(runs) + 1.2) for _, runs in groups]
    cfg = record["config"]
    snap = cfg.get("snapshot")
    fig, axes = plt.subplots(len(groups), 1, figsize=(12, sum(heights) + 1.5), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    kinds = [k for k, _ in groups]
    if "runtime" in kinds and "fresh" in kinds:  # --snapshot: restores and fresh starts on one scale
        axes[kinds.index("fresh"), 0].sharex(axes[kinds.index("runtime"), 0])
    titles = {"runtime": f"snapshot restore ({cfg['engine']})" if snap else f"{cfg['mode']} ({cfg['engine']})",
              "fresh": "fresh runc run of the same bundle", "floor": "floor (python, numpy + zmq, bind, reply)",
              "baseline": "glue baseline (sentence-transformers)",
              "import_torch": "bare import torch"}
    for ax, (kind, runs) in zip(axes[:, 0], groups):
        rows = _rows(runs)
        for y, (_label, serial, side) in enumerate(rows):
            for n, a, b in serial:
                ax.barh(y, b - a, left=a, height=0.6, color=colour[n], edgecolor="white", linewidth=0.3)
            for n, a, b in side:  # overlapped stages: a thin bar under the row
                ax.barh(y + 0.38, b - a, left=a, height=0.16, color=colour[n])
        ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms since restore" if snap and kind == "runtime" else
                      "ms since the restart request" if cfg.get("unit") and kind == "runtime" else "ms since exec")
        ax.set_title(f"{titles[kind]}, {cfg['cache']} cache", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in names]
    fig.legend(handles, names, loc="lower center", ncol=min(6, len(names)), fontsize=7, frameon=False)
    s = record["summary"]
    head = (f"restore median {s['restore_median_ms']} ms, fresh {s['fresh_median_ms']} ms "
            f"({s['ratio_fresh_over_restore']}x)" if snap else f"median {s['median_ms']} ms")
    base = f", baseline {s['baseline_median_ms']} ms, ratio {s['ratio_median']}x" if s.get("baseline_median_ms") else ""
    if s.get("floor_median_ms"):
        base += f", floor {s['floor_median_ms']} ms ({s['ratio_over_floor']}x)"
    fig.suptitle(f"edge-coldstart: {head}{base}, budget {s['budget_ms']:.0f} ms: {'PASS' if s['pass'] else 'FAIL'}",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.09, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
