"""Figures from the runs: per-phase statistics, the summary, the verdict, the table and the JSON record.

Plain Python (no numpy): the benchmark process must not map libraries the runtime would
otherwise have to read from disk in a cold-cache run.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

__all__ = ["DEFAULT_BUDGET_MS", "GOALS", "RUN_KINDS", "stats", "phase_durations", "phase_table", "summarize",
           "snapshot_summary", "verdict", "format_table", "write_json", "compare"]

DEFAULT_BUDGET_MS = 1500.0  # exec to first reply, median of the runs
# The kinds of run a pair may hold: "runtime" is what the verdict judges (the process, the
# bundle, or with --snapshot the restore); "fresh" is --snapshot's fresh `runc run` of the bundle;
# "floor" the bare Python process that only binds and answers (floor_runs.py), started the same way.
RUN_KINDS = ("runtime", "fresh", "floor", "baseline", "import_torch")
FLOOR_TITLE = "floor (python, numpy + zmq, bind, one reply)"
# This machine's goals (warm cache, median of 10); informational, the exit code follows the budget.
GOALS = {"onnxruntime_ms": 500.0, "torchscript_over_import_torch_ms": 400.0, "ratio_min": 8.0,
         "cold_own_stages_max_ratio": 2.0}


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return math.nan
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def stats(values: list[float]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "min": None, "median": None, "p95": None, "max": None}
    return {"n": len(vals), "min": round(min(vals), 1), "median": round(statistics.median(vals), 1),
            "p95": round(percentile(vals, 95), 1), "max": round(max(vals), 1)}


# Phases that are interpreter start-up or imports, the part a cold cache is expected to slow most.
IMPORT_PHASES = frozenset({"interpreter", "boot_imports", "import_manifest", "import_tokenizer", "import_engine",
                           "import_server"})


def phase_durations(run: dict) -> dict[str, float]:
    """One run's phases as durations (ms), derived phases added, in order of start."""
    phases = run.get("phases") or {}
    items = sorted(((k, v) for k, v in phases.items() if v), key=lambda kv: (kv[1][0], kv[1][1]))
    out = {k: v[1] - v[0] for k, v in items}
    if "import_tokenizer" in phases:
        # The runtime's own work: every stage but interpreter start-up and imports,
        # summed whether it ran on the main thread or beside it (boot overlaps most of
        # them), so a cold cache's cost shows even where the overlap hides it.
        out["own_stages"] = sum(d for k, d in out.items() if k not in IMPORT_PHASES)
    out["total"] = run["total_ms"]
    if (run.get("timeline") or {}).get("exec_to_ready_ms") is not None:
        ready = phases.get("ready_to_reply", [run["timeline"]["exec_to_ready_ms"]])[0]
        out["exec_to_ready"] = ready
    return out


def _overlapped(runs: list[dict]) -> set[str]:
    names = set()
    for r in runs:
        for s in (r.get("timeline") or {}).get("stages") or []:
            if s.get("overlapped"):
                names.add(s["stage"])
    return names


def phase_table(runs: list[dict]) -> dict[str, dict]:
    """name -> stats of its duration over the runs, in the order phases happen."""
    per_run = [phase_durations(r) for r in runs]
    order: list[str] = []
    for d in per_run:
        for k in d:
            if k not in order:
                order.append(k)
    derived = [k for k in ("own_stages", "exec_to_ready", "total") if k in order]
    order = [k for k in order if k not in derived] + derived
    return {k: stats([d.get(k) for d in per_run]) for k in order}


def verdict(median_ms: float | None, budget_ms: float, failed: int = 0,
            what: str = "exec to first reply") -> tuple[bool, str]:
    """(pass, one line): pass when every run replied correctly and the median is within budget."""
    if failed or median_ms is None:
        return False, f"FAIL: {failed} run(s) gave no correct reply; budget {budget_ms:.0f} ms not shown to be met"
    if median_ms <= budget_ms:
        return True, f"PASS: {what} {median_ms:.0f} ms (median) within the budget of {budget_ms:.0f} ms"
    return False, f"FAIL: {what} {median_ms:.0f} ms (median) over the budget of {budget_ms:.0f} ms"


def summarize(pairs: list[dict], engine: str, budget_ms: float, failures: int, cache: str = "warm",
              what: str = "exec to first reply") -> dict:
    totals = [p["runtime"]["total_ms"] for p in pairs if p.get("runtime")]
    base = [p["baseline"]["total_ms"] for p in pairs if p.get("baseline")]
    ratios = [p["ratio"] for p in pairs if p.get("ratio") is not None]
    own = [phase_durations(p["runtime"]).get("own_stages") for p in pairs if p.get("runtime")]
    ready = [phase_durations(p["runtime"]).get("exec_to_ready") for p in pairs if p.get("runtime")]
    torch_imp = [p["import_torch"]["total_ms"] for p in pairs if p.get("import_torch")]
    st = stats(totals)
    ok, line = verdict(st["median"], budget_ms, failures, what)
    s = {
        "runs": len(pairs), "failed_runs": failures,
        "median_ms": st["median"], "p95_ms": st["p95"], "min_ms": st["min"], "max_ms": st["max"],
        "exec_to_ready_median_ms": stats(ready)["median"],
        "own_stages_median_ms": stats([o for o in own if o is not None])["median"],
        "baseline_median_ms": stats(base)["median"], "baseline_p95_ms": stats(base)["p95"],
        "ratio_median": round(statistics.median(ratios), 2) if ratios else None,
        "ratios": [round(r, 2) for r in ratios],
        "budget_ms": budget_ms, "pass": ok, "verdict": line,
    }
    if torch_imp:
        s["import_torch_median_ms"] = stats(torch_imp)["median"]
    s["goals"] = _goals(s, engine, cache)
    return s


def snapshot_summary(pairs: list[dict], snapshot: dict | None) -> dict:
    """--snapshot's figures: the restores ("runtime") against the fresh starts of the same bundle."""
    restore = stats([p["runtime"]["total_ms"] for p in pairs if p.get("runtime")])
    fresh = stats([p["fresh"]["total_ms"] for p in pairs if p.get("fresh")])
    per_pair = [p["fresh"]["total_ms"] / p["runtime"]["total_ms"] for p in pairs if p.get("fresh") and p.get("runtime")]
    ratio = fresh["median"] / restore["median"] if fresh["median"] and restore["median"] else None
    return {"restore_median_ms": restore["median"], "restore_p95_ms": restore["p95"], "restore_min_ms": restore["min"],
            "fresh_median_ms": fresh["median"], "fresh_p95_ms": fresh["p95"], "fresh_min_ms": fresh["min"],
            "ratio_fresh_over_restore": round(ratio, 2) if ratio else None,  # of the medians
            "ratios_fresh_over_restore": [round(r, 2) for r in per_pair],
            "snapshot_image_mib": (snapshot or {}).get("image_mib"),
            "snapshot_taken_s": (snapshot or {}).get("take_s"),  # None: an existing snapshot was used
            "restore_phases_median_ms": _restore_phases([(p.get("runtime") or {}).get("reply") or {} for p in pairs])}


RESTORE_PHASES = ("outside_criu_ms", "criu_setup_ms", "criu_memory_ms", "criu_finish_ms", "criu_total_ms")


def _restore_phases(replies: list[dict]) -> dict:
    """The median of each phase of ``runc restore`` over the runs (image.bundle.snapshot.restore_phases)."""
    out = {}
    for key in RESTORE_PHASES:
        values = [r["criu"][key] for r in replies if isinstance((r.get("criu") or {}).get(key), (int, float))]
        if values:
            out[key] = round(statistics.median(values), 1)
    return out


def _goals(s: dict, engine: str, cache: str = "warm") -> dict:
    """This machine's goals for a run in ``cache`` state. The time goals are warm-cache goals;
    a cold run's own goal (its stages against a warm record's) needs ``--compare``: see compare()."""
    g: dict = {}
    if s["median_ms"] is None or cache != "warm":
        return g
    if engine == "onnxruntime":
        g["exec_to_reply_le_ms"] = GOALS["onnxruntime_ms"]
    elif s.get("import_torch_median_ms") is not None:
        g["exec_to_reply_le_ms"] = round(s["import_torch_median_ms"] + GOALS["torchscript_over_import_torch_ms"], 1)
    if "exec_to_reply_le_ms" in g:
        g["exec_to_reply_met"] = s["median_ms"] <= g["exec_to_reply_le_ms"]
    if s["ratio_median"] is not None:
        g["ratio_ge"] = GOALS["ratio_min"]
        g["ratio_met"] = s["ratio_median"] >= GOALS["ratio_min"]
    return g


def compare(record: dict, warm: dict) -> dict:
    """Per-phase median ratio of this record to a warm-cache record of the same engine."""
    mine, theirs = record["phases"]["runtime"], warm["phases"]["runtime"]
    ratios = {}
    for name, st in mine.items():
        w = theirs.get(name, {}).get("median")
        if st.get("median") is not None and w:
            ratios[name] = round(st["median"] / w, 2)
    out = {"against": warm.get("config", {}), "median_ratio": ratios}
    if "own_stages" in ratios:
        out["own_stages_ratio"] = ratios["own_stages"]
        out["own_stages_within_goal"] = ratios["own_stages"] <= GOALS["cold_own_stages_max_ratio"]
    return out


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_table(record: dict) -> str:
    lines = []
    overlapped = _overlapped([p[k] for p in record["runs"] for k in ("runtime", "fresh") if p.get(k)])
    snap = record["config"].get("snapshot")
    runtime_title = (f"snapshot restore ({record['config']['engine']})" if snap
                     else f"{record['config']['mode']} ({record['config']['engine']})")
    for kind, title in (("runtime", runtime_title), ("fresh", "fresh `runc run` of the same bundle"),
                        ("floor", FLOOR_TITLE), ("baseline", "glue baseline (sentence-transformers)"), ("import_torch", "bare `import torch`")):
        table = record["phases"].get(kind)
        if not table:
            continue
        lines.append(f"{title}, {record['config']['cache']} cache, ms:")
        lines.append(f"  {'phase':<28}{'min':>9}{'median':>9}{'p95':>9}")
        for name, st in table.items():
            label = name + (" *" if name in overlapped else "")
            if name in ("boot_imports", "own_stages", "exec_to_ready", "total") and kind in ("runtime", "fresh"):
                label = {"boot_imports": "boot_imports (edge.boot's)", "own_stages": "(own stages, summed)",
                         "exec_to_ready": "exec -> READY", "total": "TOTAL exec -> first reply"}[name]
                if snap and kind == "runtime":
                    label = label.replace("exec ->", "restore ->")
            elif name == "total" and kind == "floor":
                label = "TOTAL exec -> first reply"
            elif name == "total":
                label = "TOTAL exec -> result"
            lines.append(f"  {label:<28}{_fmt(st['min']):>9}{_fmt(st['median']):>9}{_fmt(st['p95']):>9}")
        lines.append("")
    if overlapped:
        lines.append("  * overlapped with the stages beside it (runs in a thread)")
    s = record["summary"]
    if snap:
        sn = record.get("snapshot") or {}
        how = (f"taken now in {sn['take_s']:.1f} s ({sn.get('reason')})" if sn.get("taken")
               else f"taken {sn.get('taken_at')}, reused")
        lines.append(f"snapshot: {sn.get('image_mib')} MiB of images in {sn.get('dir')}, {how}")
        ph = s.get("restore_phases_median_ms") or {}
        if ph:
            lines.append("restore phases, median ms: " + ", ".join(
                f"{k[:-3].replace('_', ' ')} {ph[k]:.1f}" for k in RESTORE_PHASES if k in ph)
                + " (runc restore; outside criu: runc, its criu version check, the exec)")
        if s.get("ratio_fresh_over_restore") is not None:
            lines.append(f"fresh / restore, per pair: {', '.join(f'{r:.2f}' for r in s['ratios_fresh_over_restore'])}; "
                         f"medians {s['fresh_median_ms']:.0f} / {s['restore_median_ms']:.0f} ms = "
                         f"{s['ratio_fresh_over_restore']:.2f}x")
    if s.get("floor_median_ms") is not None:
        what = "restore" if snap else "runtime"
        fresh = (f"; fresh {s['fresh_median_ms']:.0f} ms = {s['fresh_ratio_over_floor']:.2f}x"
                 if snap and s.get("fresh_ratio_over_floor") is not None else "")
        ratio = f"{s['ratio_over_floor']:.2f}x" if s.get("ratio_over_floor") is not None else "-"
        lines.append(f"floor: median {s['floor_median_ms']:.0f} ms (min {_fmt(s.get('floor_min_ms'))}, p95 "
                     f"{_fmt(s.get('floor_p95_ms'))}, {s.get('floor_runs')} runs); {what} / floor: "
                     f"{_fmt(s['median_ms'])} / {s['floor_median_ms']:.0f} ms = {ratio}{fresh}")
    elif "floor_median_ms" in s:
        lines.append("floor: not measured (" + (((record.get("config") or {}).get("floor") or {}).get("note")
                                                or "no floor run replied") + ")")
    if s.get("ratio_median") is not None:
        lines.append(f"baseline / runtime, per pair: {', '.join(f'{r:.1f}' for r in s['ratios'])}; "
                     f"median {s['ratio_median']:.1f}x")
    cache = record.get("config", {}).get("cache", "warm")
    if s.get("goals") or cache != "warm":
        g = s.get("goals") or {}
        parts = []
        if "exec_to_reply_le_ms" in g:
            parts.append(f"median <= {g['exec_to_reply_le_ms']:.0f} ms: {'met' if g['exec_to_reply_met'] else 'NOT met'}")
        if "ratio_ge" in g:
            parts.append(f">= {g['ratio_ge']:.0f}x baseline: {'met' if g['ratio_met'] else 'NOT met'}")
        c = record.get("compare") or {}
        if cache != "warm" and "own_stages_ratio" in c:
            parts.append(f"own stages <= {GOALS['cold_own_stages_max_ratio']:.0f}x the warm record's: "
                         f"{'met' if c['own_stages_within_goal'] else 'NOT met'} (x{c['own_stages_ratio']})")
        elif cache != "warm":
            parts.append("own stages against warm: pass a warm record with --compare")
        lines.append(f"goals (this machine, {cache} cache): " + "; ".join(parts))
    if record.get("compare"):
        c = record["compare"]
        lines.append(f"against {c['against'].get('cache', '?')} record, median ratio per phase: "
                     + ", ".join(f"{k} x{v}" for k, v in c["median_ratio"].items()))
    return "\n".join(lines)


def write_json(record: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
