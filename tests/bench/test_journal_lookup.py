"""The journal lookup benchmark, short: 20,000 entries written through the real journal, then
`edge trace` for the oldest, the newest and a missing id; the record is complete and the goal met
(with 50 times fewer entries than the benchmark's default, the goal leaves a wide margin)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_short_run_prints_and_records_every_figure(tmp_path):
    out = tmp_path / "journal_lookup.json"
    r = subprocess.run([sys.executable, "-m", "bench.journal_lookup", "--entries", "20000", "--runs", "1",
                        "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "journal_lookup: 20000 entries, worst edge trace" in r.stdout and "(met)" in r.stdout
    rec = json.loads(out.read_text())
    w = rec["write"]
    assert w["entries"] == 20000 and 0 < w["bytes"] <= w["cap_bytes"] and 120 < w["bytes_per_entry"] < 600
    assert w["writer_entries_per_s"] > 100 * rec["saturation_rps"] and w["note_us"] > 0
    assert set(rec["lookups"]) == {"oldest", "newest", "missing"}
    for name, look in rec["lookups"].items():
        assert 0 < look["in_process_s"]["min"] <= look["in_process_s"]["median"], name
        assert 0 < look["edge_trace_s"]["min"] < rec["goal_s"] and look["edge_trace_cold_s"] > 0, name
    assert 0 < rec["worst_edge_trace_s"] <= rec["goal_s"] and rec["vs_goal"] <= 1
    assert rec["day_at_saturation"]["entries"] == round(rec["saturation_rps"] * 86400)
