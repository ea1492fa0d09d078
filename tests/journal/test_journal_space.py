"""The journal's bytes on a real, small file system (a tmpfs; root only, else skipped): one cap
covers the segments and the rejected samples, the oldest of either deleted first, and a sample
counts what it takes on disk; a full disk pauses writing, counts what is lost (never as written),
retries once per wait, not once per entry, and resumes by itself when space comes back."""

from __future__ import annotations

import json
import os

from journal_support import LINEAGE, finished_request, peer, wait_for
from support.tmpfs import fill, tmpfs, used_bytes

from edge.observability.journal import reader
from edge.observability.journal.budget import ByteCap
from edge.observability.journal.rejected import SAMPLE_DISK_BYTES, RejectedStore, capture, read_sample
from edge.observability.journal.segments import SegmentFiles, list_segments
from edge.observability.journal.writer import Journal

OVERLONG = [b'\x82\xa1v\x01\xa4type\xa5infer', b"y" * 40_000]  # the frames of an over-long text, as captured
MESSAGE = "texts[0] has 40000 bytes, more than max_text_bytes 32768"


def _meta(i: int) -> dict:  # what the writer records with a sample
    return {"time_ms": 1796278084000 + i, "type": "infer", "code": 1006, "name": "TEXT_TOO_LONG", "message": MESSAGE,
            "request_id": None, "client": {"identity": "006b8b4567", "connection": 12, "peer": "localhost:0:0:4242"}}


def _entry(j: Journal) -> str:
    p = peer()
    j.note("infer", p, 0, None, None, finished_request(p))
    return p.trace_id


def _refused(j: Journal) -> str:
    p = peer()
    p.sample = capture(OVERLONG, j.sample_bytes)
    j.note("infer", p, 1006, MESSAGE, None)
    return p.trace_id


def _events(capsys) -> list[dict]:
    return [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]


def _whole_lines(directory: str) -> int:
    """Entries in the segments, every line whole and parsed (a write cut short left no torn line)."""
    n = 0
    for _, path, _ in list_segments(directory):
        data = open(path, "rb").read()
        assert data.endswith(b"\n"), path
        for line in data.splitlines():
            n += "t" in json.loads(line)
    return n


def test_samples_count_within_the_cap_oldest_first_as_the_blocks_they_take(tmp_path):
    with tmpfs(tmp_path / "state", 1 << 20) as state:
        cap = ByteCap(128 << 10)  # segments of 8 KiB
        seg = SegmentFiles(str(state / "journal"), cap.max_bytes, cap=cap)
        rej = RejectedStore(str(state / "rejected"), 10_000, cap)
        seg.open()
        rej.open()
        order: list = []  # what was written, oldest first: ("sample", id) and ("segment", seq) once closed
        line = b'{"t":"0123456789abcdef","ts":1,"k":"infer","pad":"' + b"x" * 150 + b'"}\n'

        def exists(item, segs=None) -> bool:
            kind, key = item
            if kind == "sample":
                return (state / "rejected" / f"{key}.json").exists()
            return key in (segs or {seq for seq, _, _ in list_segments(str(state / "journal"))})

        def check() -> None:
            seg.flush()  # the worst case: everything counted is on disk
            assert cap.used <= cap.max_bytes
            # tmpfs allocates whole pages: the samples take exactly what the cap counts for them,
            # each segment at most one partly used page more
            samples = sum(os.stat(p).st_blocks * 512 for p in (state / "rejected").iterdir())
            assert samples == rej.on_disk
            assert used_bytes(state) <= cap.max_bytes + seg.count * 4096
            segs = {seq for seq, _, _ in list_segments(str(state / "journal"))}
            kept = [exists(item, segs) for item in order]
            assert kept == sorted(kept), "a newer item was deleted before an older one"

        def samples(n: int) -> None:
            for i in range(n):
                tid = os.urandom(8).hex()
                rej.add(tid, _meta(i), capture(OVERLONG))
                order.append(("sample", tid))
                check()

        def entries(rotations: int) -> None:
            for _ in range(100_000):
                before = seg.seq
                seg.append(line, "lineage00001", LINEAGE, 1)
                if before and seg.seq != before:
                    order.append(("segment", before))
                    rotations -= 1
                check()
                if rotations == 0:
                    return

        samples(10)  # A
        assert rej.on_disk == 10 * SAMPLE_DISK_BYTES == 10 * 8192  # a 4,096-byte .bin and a ~0.4 KiB .json
        entries(2)  # B
        samples(10)  # C: the cap is reached, and A's oldest samples go, not B's newer segments
        assert not exists(order[0]) and all(exists(item) for item in order[10:])
        entries(40)  # D: the segments take it all back, the oldest first
        assert rej.count == 0 and cap.used <= cap.max_bytes and seg.count == len(list_segments(str(state / "journal")))
        seg.close()


def test_a_smaller_cap_at_restart_deletes_the_oldest_segments_and_samples(tmp_path):
    d, r = str(tmp_path / "journal"), str(tmp_path / "rejected")
    j = Journal(d, 1 << 20, LINEAGE, rejected_dir=r, keep_rejected=1000)
    old = [_refused(j) for _ in range(20)]
    for _ in range(2000):
        _entry(j)
    new = [_refused(j) for _ in range(20)]
    j.stop()
    assert j.info()["rejected"]["kept"] == 40
    j = Journal(d, 128 << 10, LINEAGE, rejected_dir=r, keep_rejected=1000)
    j.stop()  # opens, counts what is there, deletes down to the cap, writes nothing
    info = j.info()
    assert info["bytes"] + info["rejected"]["bytes"] == info["used_bytes"] <= 128 << 10
    assert not any(read_sample(r, t) for t in old) and read_sample(r, new[-1]) is not None


def test_a_full_disk_pauses_both_halves_counts_the_loss_and_resumes_when_space_returns(tmp_path, capsys):
    with tmpfs(tmp_path / "state", 512 << 10) as state:
        d, r = str(state / "journal"), str(state / "rejected")
        # The cap above the disk, as in issue 26: the disk is full before the cap is reached.
        j = Journal(d, 4 << 20, LINEAGE, rejected_dir=r, keep_rejected=1000, flush_s=0.05, retry_s=0.05,
                    retry_max_s=0.2).start()
        filler = fill(state / "filler", leave_bytes=96 << 10)
        noted = 0

        def both(paused: bool) -> bool:
            nonlocal noted
            _refused(j)
            _entry(j)
            noted += 2
            return j.paused("journal") == paused and j.paused("rejected") == paused

        assert wait_for(lambda: both(True), 20.0), j.info()
        assert wait_for(lambda: j.info()["queued"] == 0 and j.info()["entries_buffered"] == 0, 10.0)
        info = j.info()
        # What counts as written is on disk, whole; what is not there is counted as lost.
        assert info["enabled"] and info["rejected"]["enabled"] and not info["errors"]
        assert info["entries_written"] == _whole_lines(d) == reader.extent(d)["entries"]
        assert info["dropped_by_reason"]["no_space"] > 0 and info["rejected"]["lost"] > 0
        assert noted == info["entries_written"] + info["entries_dropped"]
        assert noted // 2 == info["rejected"]["written"] + info["rejected"]["lost"]
        names = set(os.listdir(r))
        assert {n[:-5] for n in names if n.endswith(".json")} == {n[:-4] for n in names if n.endswith(".bin")}
        assert all(read_sample(r, n[:-5])["code"] == 1006 for n in names if n.endswith(".json"))
        events = [e for e in _events(capsys) if e["event"].startswith("journal.")]
        assert {e["part"] for e in events if e["event"] == "journal.paused"} == {"journal", "rejected"}
        assert not [e for e in events if e["event"] == "journal.disabled"]

        filler.unlink()  # space comes back: the next try after the wait writes again
        assert wait_for(lambda: both(False), 20.0), j.info()
        entry, refused = _entry(j), _refused(j)
        assert wait_for(lambda: reader.find(d, entry), 5.0) and read_sample(r, refused) is not None
        assert {e["part"] for e in _events(capsys) if e["event"] == "journal.resumed"} == {"journal", "rejected"}
        assert j.stop(5.0)


def test_while_paused_one_write_is_tried_per_wait_not_one_per_entry(tmp_path):
    with tmpfs(tmp_path / "state", 256 << 10) as state:
        d, r = str(state / "journal"), str(state / "rejected")
        j = Journal(d, 4 << 20, LINEAGE, rejected_dir=r, keep_rejected=1000, flush_s=0.05, retry_s=600.0).start()
        fill(state / "filler", leave_bytes=0)
        _entry(j)
        _refused(j)
        assert wait_for(lambda: j.paused("journal") and j.paused("rejected"), 10.0), j.info()
        before = j.info()
        for _ in range(3000):
            _entry(j)
        for _ in range(300):
            _refused(j)
        assert wait_for(lambda: j.info()["queued"] == 0, 10.0)
        after = j.info()
        assert after["write_errors"] == before["write_errors"] == 2  # the first failure of each half, no more
        assert after["dropped_by_reason"]["no_space"] - before["dropped_by_reason"]["no_space"] == 3300
        assert after["rejected"]["lost"] - before["rejected"]["lost"] == 300
        assert after["entries_written"] == 0 and after["paused"] and 0 < after["retry_in_s"] <= 600.0
        assert j.stop(5.0)
