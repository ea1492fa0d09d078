"""The journal on disk: the cap holds at every write, torn lines are skipped, lookups find the
newest and the oldest entry and miss cleanly, lineages come back, and neither a full queue nor a
failing disk ever reaches the caller."""

from __future__ import annotations

import errno
import json
import os
import stat
import time

import pytest
from journal_support import LINEAGE, finished_request, peer, wait_for

from edge.observability.journal import reader, segments
from edge.observability.journal.format import segment_name
from edge.observability.journal.rejected import SAMPLE_BYTES, capture, read_sample
from edge.observability.journal.segments import SegmentFiles, list_segments
from edge.observability.journal.writer import Journal


def _disk(directory) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory) if n.endswith(".jsonl"))


def _fill(j: Journal, n: int, kind: str = "infer") -> list[str]:
    ids = []
    for _ in range(n):
        p = peer()
        ids.append(p.trace_id)
        j.note(kind, p, 0, None, None, finished_request(p))
    return ids


# ------------------------------------------------------------------ the cap


def test_the_cap_holds_at_every_write_and_every_rotation(tmp_path):
    d = str(tmp_path / "journal")
    cap = 64 << 10  # 16 segments of 4 KiB
    files = SegmentFiles(d, cap)
    files.open()
    line = b'{"t":"0123456789abcdef","ts":1,"k":"infer","pad":"' + b"x" * 150 + b'"}\n'
    rotations = 0
    for i in range(3000):
        before = files.seq
        files.append(line, "lineage00001", LINEAGE, 1)
        files.flush()  # the worst case: everything counted is on disk
        on_disk = _disk(d)
        assert on_disk <= cap, f"{on_disk} bytes on disk after entry {i}, cap {cap}"
        assert on_disk == files.on_disk
        if files.seq != before:
            rotations += 1
            sizes = [s for _, _, s in list_segments(d)]
            assert all(s <= files.segment_bytes for s in sizes), sizes
    files.close()
    assert rotations > 100 and len(list_segments(d)) <= cap // files.segment_bytes + 1
    assert files.segments_created == rotations


def test_segments_left_by_an_earlier_run_count_against_a_smaller_cap(tmp_path):
    d = tmp_path / "journal"
    d.mkdir()
    for seq in range(1, 11):  # 10 x 10 KiB from a run with a larger cap
        (d / segment_name(seq)).write_bytes(b"{}\n" * ((10 << 10) // 3))
    j = Journal(str(d), 64 << 10, LINEAGE)
    ids = _fill(j, 50)
    j.stop()
    assert _disk(d) <= 64 << 10 and j.info()["bytes"] == _disk(d)
    assert not (d / segment_name(1)).exists() and reader.find(str(d), ids[-1]) is not None
    assert min(seq for seq, _, _ in list_segments(str(d))) > 1 and max(seq for seq, _, _ in list_segments(str(d))) > 10


def test_the_journal_never_exceeds_its_cap_through_the_writer(tmp_path):
    d = str(tmp_path / "journal")
    j = Journal(d, 64 << 10, LINEAGE)
    sizes = []
    real_rotate = SegmentFiles._rotate

    def rotate(self, pid):  # measure what is on disk at each rotation
        sizes.append(_disk(d))
        return real_rotate(self, pid)

    SegmentFiles._rotate = rotate
    try:
        _fill(j, 5000)
        j.stop()
    finally:
        SegmentFiles._rotate = real_rotate
    assert j.written == 5000 and len(sizes) > 50
    assert max(sizes) <= 64 << 10 and _disk(d) <= 64 << 10


# ------------------------------------------------------------------ reading


def test_lookup_newest_oldest_missing_across_segments(tmp_path):
    d = str(tmp_path / "journal")
    j = Journal(d, 1 << 20, LINEAGE, segment_bytes=16 << 10)
    ids = _fill(j, 1000)
    j.stop()
    assert len(list_segments(d)) > 5
    for tid in (ids[0], ids[1], ids[500], ids[-1]):
        found = reader.find(d, tid)
        assert found is not None and found.entry["t"] == tid and found.lineage == LINEAGE
        assert found.entry["tok"] == [12, 30]
    assert reader.find(d, "0123456789abcdef") is None
    x = reader.extent(d)
    assert x["entries"] == 1000 and x["segments"] == len(list_segments(d)) and x["oldest_ms"] <= x["newest_ms"]
    newest = reader.last(d, 3)
    assert [e["t"] for e, _ in newest] == ids[-3:] and all(lin == LINEAGE for _, lin in newest)


def test_a_torn_last_line_is_skipped_and_never_appended_to(tmp_path):
    d = str(tmp_path / "journal")
    j = Journal(d, 1 << 20, LINEAGE)
    ids = _fill(j, 20)
    j.stop()
    (_, last_path, _), = list_segments(d)
    torn_id = "feedfacefeedface"
    with open(last_path, "ab") as f:  # a power cut: half a line, then zeros (ext4's delayed allocation)
        f.write(b'{"t":"' + torn_id.encode() + b'","ts":17000')
    assert reader.find(d, torn_id) is None
    assert reader.find(d, ids[-1]) is not None and [e["t"] for e, _ in reader.last(d, 2)] == ids[-2:]
    with open(last_path, "ab") as f:
        f.write(b"\0" * 4096)
    assert reader.find(d, ids[-1]) is not None and reader.extent(d)["entries"] == 20
    size = os.path.getsize(last_path)
    j2 = Journal(d, 1 << 20, LINEAGE)  # the next process: a new segment, the torn one untouched
    later = _fill(j2, 3)
    j2.stop()
    assert os.path.getsize(last_path) == size and len(list_segments(d)) == 2
    assert reader.find(d, later[0]) is not None and [e["t"] for e, _ in reader.last(d, 4)] == ids[-1:] + later


def test_each_entry_comes_back_with_its_own_lineage(tmp_path):
    d = str(tmp_path / "journal")
    other = {**LINEAGE, "model_sha256": "n" * 64, "edge_commit": None}
    j = Journal(d, 1 << 20, LINEAGE)
    first = _fill(j, 5)
    j.stop()
    j = Journal(d, 1 << 20, other)  # a restart with another package
    second = _fill(j, 5)
    j.stop()
    assert reader.find(d, first[2]).lineage == LINEAGE and reader.find(d, second[2]).lineage == other
    # Two lineages in one segment (a fallback package, later): each entry names its own record.
    files = SegmentFiles(str(tmp_path / "mixed"), 1 << 20)
    files.open()
    files.append(b'{"t":"aaaaaaaaaaaaaaaa","l":"lineage0000a"}\n', "lineage0000a", LINEAGE, 1)
    files.append(b'{"t":"bbbbbbbbbbbbbbbb","l":"lineage0000b"}\n', "lineage0000b", other, 1)
    files.close()
    assert reader.find(files.directory, "aaaaaaaaaaaaaaaa").lineage == LINEAGE
    assert reader.find(files.directory, "bbbbbbbbbbbbbbbb").lineage == other


# ------------------------------------------------------------------ never in the way


def test_note_only_queues_and_a_full_queue_drops_and_counts(tmp_path):
    d = tmp_path / "journal"
    j = Journal(str(d), 1 << 20, LINEAGE, queue_max=5)
    start = time.perf_counter()
    ids = _fill(j, 12)
    assert (time.perf_counter() - start) / 12 < 0.005  # a tuple on a deque (generous: a loaded 2-core machine)
    assert not d.exists()  # nothing touched the disk: the writer thread does that
    info = j.info()
    assert info["queued"] == 5 and info["dropped_by_reason"]["queue_full"] == 7 and info["entries_dropped"] == 7
    j.stop()
    assert j.written == 5 and reader.find(str(d), ids[4]) is not None and reader.find(str(d), ids[5]) is None


def test_the_writer_thread_writes_within_seconds_and_stop_drains(tmp_path):
    d = str(tmp_path / "journal")
    j = Journal(d, 1 << 20, LINEAGE, flush_s=0.2).start()
    first = _fill(j, 1)
    assert wait_for(lambda: reader.find(d, first[0]), 5.0), "an entry did not reach the disk within 5 s"
    burst = _fill(j, 3000)
    assert j.stop(10.0)
    assert j.written == 3001 and reader.find(d, burst[-1]) is not None and reader.extent(d)["entries"] == 3001


@pytest.mark.parametrize("explicit, level", [(True, "error"), (False, "warning")])
def test_an_unusable_directory_turns_the_journal_off_counted_and_logged_once(tmp_path, capsys, explicit, level):
    (tmp_path / "file").write_text("not a directory")
    j = Journal(str(tmp_path / "file" / "journal"), 1 << 20, LINEAGE, explicit=explicit)
    _fill(j, 3)
    j.stop()
    info = j.info()
    assert info["enabled"] is False and info["write_errors"] == 1 and "NotADirectoryError" in info["errors"]["journal"]
    assert info["dropped_by_reason"]["disabled"] == 3 and info["entries_written"] == 0  # queued before it failed
    _fill(j, 4)  # after the failure: counted, never queued
    assert j.info()["dropped_by_reason"]["disabled"] == 3 + 4 and j.info()["queued"] == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [x["event"] for x in lines].count("journal.disabled") == 1
    assert [x["level"] for x in lines if x["event"] == "journal.disabled"] == [level]  # a default dir: warning


def test_a_disk_that_fills_up_mid_run_pauses_the_journal_and_counts_the_loss(tmp_path, monkeypatch, capsys):
    d = str(tmp_path / "journal")
    j = Journal(d, 1 << 20, LINEAGE)
    _fill(j, 10)
    j.stop()
    assert j.written == 10

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    j = Journal(d, 1 << 20, LINEAGE)
    monkeypatch.setattr(segments.os, "write", full)
    _fill(j, 10)
    j.stop()
    info = j.info()
    assert info["enabled"] is True and info["paused"] is True and info["write_errors"] == 1 and not info["errors"]
    assert info["entries_written"] == 0 and info["dropped_by_reason"]["no_space"] == 10
    out = capsys.readouterr().out
    assert "journal.paused" in out and "journal.disabled" not in out
    assert reader.extent(d)["entries"] == 10  # the first run's: nothing of the second one reached a file


# ------------------------------------------------------------------ rejected samples


def test_rejected_samples_are_bounded_private_and_truncated(tmp_path):
    rejected = tmp_path / "rejected"
    j = Journal(str(tmp_path / "journal"), 1 << 20, LINEAGE, rejected_dir=str(rejected), keep_rejected=3)
    assert j.sample_bytes == SAMPLE_BYTES
    ids = []
    for i in range(10):
        p = peer()
        p.sample = capture([b'{"v":1,"type":"infer"}', b"x" * 10_000 + str(i).encode()], j.sample_bytes)
        ids.append(p.trace_id)
        j.note("invalid", p, 1006, "texts[0] has 10001 bytes", None)
    ok = peer()
    ok.sample = capture([b"a", b"b"])
    j.note("health", ok, 0)  # not refused: no sample
    j.stop()
    names = sorted(os.listdir(rejected))
    assert names == sorted(f"{t}{ext}" for t in ids[-3:] for ext in (".bin", ".json"))
    assert stat.S_IMODE(os.stat(rejected).st_mode) == 0o700
    for name in names:
        assert stat.S_IMODE(os.stat(rejected / name).st_mode) == 0o600
    assert os.path.getsize(rejected / f"{ids[-1]}.bin") == SAMPLE_BYTES
    s = read_sample(str(rejected), ids[-1])
    assert s["code"] == 1006 and s["name"] == "TEXT_TOO_LONG" and s["truncated"] is True and s["frames_total"] == 2
    assert [(f["size"], f["kept"], f["truncated"]) for f in s["frames"]] == [(22, 22, False),
                                                                            (10_001, SAMPLE_BYTES - 22, True)]
    assert s["frames"][0]["data"] == b'{"v":1,"type":"infer"}' and s["client"]["identity"] == "0080000001"
    on_disk = sum(-(-os.path.getsize(rejected / n) // j.rejected.block) * j.rejected.block for n in names)
    assert j.info()["rejected"] == {"enabled": True, "paused": False, "pauses": 0, "dir": str(rejected), "keep": 3,
                                    "kept": 3, "bytes": on_disk, "written": 10, "lost": 0, "too_large": 0}
    j2 = Journal(None, 0, LINEAGE, rejected_dir=str(rejected), keep_rejected=2)  # a restart keeps the newest
    j2.stop()
    assert sorted(os.listdir(rejected)) == sorted(f"{t}{ext}" for t in ids[-2:] for ext in (".bin", ".json"))


def test_capture_of_many_frames_records_sixteen_sizes_and_4_kib(tmp_path):
    sizes, kept = capture([b"y" * 1000] * 40)
    assert len(sizes) == 16 and sum(map(len, kept)) == SAMPLE_BYTES and kept[5] == b""


@pytest.mark.parametrize("max_bytes, keep", [(0, 0)])
def test_nothing_asked_nothing_opened(tmp_path, max_bytes, keep):
    from argparse import Namespace

    from edge.observability.journal.writer import open_journal

    args = Namespace(state_dir=str(tmp_path), journal_dir=None, journal_max_bytes=max_bytes, keep_rejected=keep)
    assert open_journal(args, LINEAGE) is None
    args.journal_max_bytes = 1 << 20
    j = open_journal(args, LINEAGE)
    assert j.directory == str(tmp_path / "journal") and j.rejected is None and j.explicit
    args.state_dir = None
    assert open_journal(args, LINEAGE).explicit is False  # the default directory: nobody asked for it
    args.state_dir, args.journal_dir, args.keep_rejected = str(tmp_path), "off", 2
    j = open_journal(args, LINEAGE)
    assert j.directory is None and j.rejected.directory == str(tmp_path / "rejected")
