"""``edge trace`` on a journal its runtime's user has tampered with (issue 26): it runs as root
and trusts none of it. A real journal, written by :class:`~edge.observability.journal.writer.Journal` as the
runtime writes it, gets one hostile thing added, and the real CLI (a subprocess, with a timeout:
a hang fails) must exit with a clear error or report what it skipped, never a traceback; the
good entries must still be found, by trace id and by ``--last N``; and nothing it prints may
hold a raw terminal control character."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from journal_support import LINEAGE, finished_request, peer

from edge.observability.journal.format import header_line, segment_name, segment_seq
from edge.observability.journal.writer import Journal

OLD, NEW, BAD = "0123456789abc0de", "0123456789abc1de", "badbadbadbadbad0"
RAW = ("\x1b", "\x07", "\r", "\x9b", "\x7f", "\u202e", "\u2028", "\u2066", "\x00")  # never printed as is
HOSTILE = "\x1b]0;owned\x07\x1b[2J\r\x9b31m\u202eevil\u2028\x7f"


def _trace(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "edge.cli", "trace", *args], capture_output=True, text=True,
                       timeout=30, errors="surrogateescape")  # a hang fails the test (TimeoutExpired)
    assert "Traceback" not in r.stderr and r.returncode in (0, 1, 2), (r.returncode, r.stderr)
    for ch in RAW:
        assert ch not in r.stdout and ch not in r.stderr, (ch, r.stdout[-2000:], r.stderr)
    return r


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A state directory with a real journal of 60 entries in several segments."""
    root = tmp_path_factory.mktemp("state")
    j = Journal(str(root / "journal"), 1 << 20, LINEAGE, rejected_dir=str(root / "rejected"), keep_rejected=2,
                segment_bytes=8 << 10)
    for i in range(60):
        p = peer()
        j.note("infer", p, 0, None, i, finished_request(p))
    j.stop()
    return root


@pytest.fixture
def state(base, tmp_path) -> Path:
    shutil.copytree(base, tmp_path / "s")
    return tmp_path / "s"


def _segments(journal: Path) -> list[Path]:
    return sorted((p for p in journal.iterdir() if segment_seq(p.name) is not None), key=lambda p: p.name)


def _template(journal: Path) -> tuple[dict, bytes]:
    """A real entry of the journal, and its segment's lineage record line."""
    data = _segments(journal)[-1].read_bytes()
    lines = data.splitlines()
    return json.loads(lines[-1]), next(line for line in lines if line.startswith(b'{"L":'))


def _entry(template: dict, trace_id: str, rid, **fields) -> bytes:
    return json.dumps({**template, "t": trace_id, "rid": rid, **fields}, separators=(",", ":")).encode()


def _next_seq(journal: Path) -> int:
    return max(segment_seq(p.name) for p in _segments(journal)) + 1


def _add_segment(journal: Path, lines: list[bytes]) -> Path:
    """A newest segment: a header, then the lines (each with its newline)."""
    seq = _next_seq(journal)
    path = journal / segment_name(seq)
    path.write_bytes(header_line(seq, 4242) + b"".join(line + b"\n" for line in lines))
    return path


def _check_found(state: Path, trace_id: str) -> dict:
    r = _trace(trace_id, "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["trace_id"] == trace_id and rec["lineage"] == LINEAGE and "skipped" in rec
    r = _trace(trace_id, "--state-dir", str(state))
    assert r.returncode == 0 and r.stdout.startswith(f"trace {trace_id}  infer  ok"), r.stderr
    return rec


# ------------------------------------------------------------------ bad lines


def _deep(template: dict) -> bytes:
    return b'{"t":"' + BAD.encode() + b'","x":' + b"[" * 200_000 + b"]" * 60_000  # 260 KB, not closed


def _deep_dict(template: dict) -> bytes:
    return b'{"t":"' + BAD.encode() + b'","x":' + b'{"a":' * 20_000 + b"1" + b"}" * 20_001


LINES = {
    "ms is a number": lambda t: _entry(t, BAD, "bad", ms=5),
    "tok is a number": lambda t: _entry(t, BAD, "bad", tok=7),
    "tr is a number": lambda t: _entry(t, BAD, "bad", tr=1),
    "bat is a list of numbers": lambda t: _entry(t, BAD, "bad", bat=[1, 2]),
    "ts is 1e30": lambda t: _entry(t, BAD, "bad", ts=0).replace(b'"ts":0', b'"ts":1e30'),
    "ts is 10**30": lambda t: _entry(t, BAD, "bad", ts=10 ** 30),
    "ts is NaN": lambda t: _entry(t, BAD, "bad", ts=0).replace(b'"ts":0', b'"ts":NaN'),
    "ts is negative": lambda t: _entry(t, BAD, "bad", ts=-5),
    "rid is an object": lambda t: _entry(t, BAD, {"a": [1]}),
    "msg is a number": lambda t: _entry(t, BAD, "bad", msg=3),
    "200,000-deep JSON": _deep,
    "20,000-deep objects": _deep_dict,
    "a 5,000-digit number": lambda t: _entry(t, BAD, "bad", ts=0).replace(b'"ts":0', b'"ts":' + b"9" * 5000),
    "over-long line": lambda t: _entry(t, BAD, "bad", msg="a" * (400 << 10)),
    "not JSON": lambda t: b'{"t":"' + BAD.encode() + b'","ts":',
    "invalid UTF-8": lambda t: _entry(t, BAD, "bad", msg="x").replace(b'"x"', b'"\xff\xfe"'),
    "a NUL byte": lambda t: _entry(t, BAD, "bad", msg="x").replace(b'"x"', b'"\0"'),
}


@pytest.mark.parametrize("shape", list(LINES))
def test_a_bad_line_is_skipped_and_counted_and_hides_nothing(state, shape):
    journal = state / "journal"
    template, lineage = _template(journal)
    last_real = template["rid"]
    _add_segment(journal, [lineage, _entry(template, OLD, "old"), LINES[shape](template),
                           _entry(template, NEW, "new")])
    assert _check_found(state, OLD)["request_id"] == "old"
    assert _check_found(state, NEW)["request_id"] == "new"
    r = _trace("--last", "3", "--state-dir", str(state), "--json")
    assert r.returncode == 0, r.stderr
    assert [x["request_id"] for x in json.loads(r.stdout)] == [last_real, "old", "new"]
    assert "skipped 1 bad journal line" in r.stderr, r.stderr
    r = _trace("--last", "3", "--state-dir", str(state))
    assert r.returncode == 0 and r.stdout.count("\ntrace ") == 2 and "skipped 1 bad journal line" in r.stderr
    r = _trace(BAD, "--state-dir", str(state))  # the bad line itself: not an entry
    assert r.returncode == 1 and "is not in the journal" in r.stderr and "skipped 1 bad journal line" in r.stderr
    r = _trace(BAD, "--state-dir", str(state), "--json")
    assert r.returncode == 1 and r.stdout == ""


def test_many_bad_lines_never_hide_the_good_ones_from_last(state):
    journal = state / "journal"
    template, lineage = _template(journal)
    bad = [fn(template) for fn in LINES.values()]
    _add_segment(journal, [lineage] + [line for b in bad for line in (b, _entry(template, OLD, "old"))][:-1]
                 + [_entry(template, NEW, "new")] + bad)
    r = _trace("--last", "2", "--state-dir", str(state), "--json")
    assert r.returncode == 0 and [x["request_id"] for x in json.loads(r.stdout)] == ["old", "new"], r.stderr
    n = int(r.stderr.split("skipped ")[1].split()[0])
    assert n >= len(LINES), r.stderr


# ------------------------------------------------------------------ files that are not segments


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path) -> None:
    os.symlink("/dev/zero", path)


def _to_segment(path: Path) -> None:  # a symlink to a real segment: refused too (never followed)
    os.symlink(_segments(path.parent)[0], path)


def _loop(path: Path) -> None:
    os.symlink(path.name, path)


FILES = {"a directory": os.mkdir, "a FIFO": _fifo, "a symlink to /dev/zero": _zero,
         "a symlink to a segment": _to_segment, "a symlink loop": _loop}


@pytest.mark.parametrize("shape", list(FILES))
def test_a_segment_that_is_not_a_regular_file_is_refused_never_read(state, shape):
    journal = state / "journal"
    template, lineage = _template(journal)
    last_real = template["rid"]
    _add_segment(journal, [lineage, _entry(template, OLD, "old")])
    bad = journal / segment_name(_next_seq(journal))
    FILES[shape](bad)
    rec = _check_found(state, OLD)
    assert rec["skipped"]["files"] == [{"path": str(bad), "reason": rec["skipped"]["files"][0]["reason"]}]
    assert "not a regular file" in rec["skipped"]["files"][0]["reason"]
    assert _check_found(state, _template_id(journal, 0))["request_id"] == 0
    r = _trace("--last", "2", "--state-dir", str(state), "--json")
    assert r.returncode == 0 and [x["request_id"] for x in json.loads(r.stdout)] == [last_real, "old"], r.stderr
    assert "refused 1 file(s): " + str(bad) in r.stderr and "not a regular file" in r.stderr
    r = _trace(BAD, "--state-dir", str(state))
    assert r.returncode == 1 and "is not in the journal" in r.stderr and "refused 1 file(s)" in r.stderr


def _template_id(journal: Path, rid: int) -> str:
    for seg in _segments(journal):
        for line in seg.read_bytes().splitlines():
            if line.startswith(b'{"t":') and json.loads(line).get("rid") == rid:
                return json.loads(line)["t"]
    raise AssertionError(rid)


def test_a_huge_sparse_segment_is_refused(state):
    journal = state / "journal"
    with open(journal / segment_name(_next_seq(journal)), "wb") as f:
        f.truncate(3 << 30)  # 3 GiB of nothing, on no disk
    r = _trace("--last", "1", "--state-dir", str(state), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["request_id"] == 59 and "more than the" in r.stderr


def test_an_unreadable_journal_is_a_clear_error(tmp_path):
    (tmp_path / "journal").write_text("not a directory")
    r = _trace("--last", "1", "--journal-dir", str(tmp_path / "journal"))
    assert r.returncode == 2 and "no journal at" in r.stderr
    r = _trace("--last", "1", "--journal-dir", str(tmp_path / "journal") + "\x1b[2J")
    assert r.returncode == 2 and "\\x1b[2J" in r.stderr


# ------------------------------------------------------------------ escapes


def test_control_characters_in_every_field_are_escaped(state):
    journal = state / "journal"
    template, _ = _template(journal)
    lid = "e5ca9ee5ca9e"
    lineage = {**LINEAGE, "model": "model" + HOSTILE, "edge_commit": HOSTILE, "device": "\u2066cuda\u2069"}
    record = json.dumps({"L": lid, "lineage": lineage}, separators=(",", ":"), ensure_ascii=False).encode()
    fields = dict(k="infer" + HOSTILE, msg="refused" + HOSTILE, err="NAME" + HOSTILE, peer="host" + HOSTILE,
                  rid="rid" + HOSTILE, drop="gone" + HOSTILE, code=1003, l=lid)
    raw = json.dumps({**template, "t": OLD, **fields}, separators=(",", ":"), ensure_ascii=False).encode()
    assert b"\xe2\x80\xae" in raw and b"\\u001b" in raw  # U+202E as UTF-8 bytes; ESC as JSON must escape it
    _add_segment(journal, [record, raw])
    r = _trace(OLD, "--state-dir", str(state))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x9b31m\\u202eevil\\u2028\\x7f" in out
    for what in ("refused", "NAME", "host", "gone", "model model", "edge_commit ", "\\u2066cuda\\u2069"):
        assert what in out, what
    r = _trace(OLD, "--state-dir", str(state), "--json")
    assert r.returncode == 0 and r.stdout.isascii()
    rec = json.loads(r.stdout)
    assert rec["message"] == "refused" + HOSTILE and rec["type"] == "infer" + HOSTILE
    assert rec["name"] == "NAME" + HOSTILE and rec["client"]["peer"] == "host" + HOSTILE
    assert rec["lineage"] == lineage and rec["request_id"] == "rid" + HOSTILE and rec["dropped"] == "gone" + HOSTILE
    r = _trace("--last", "1", "--state-dir", str(state))
    assert r.returncode == 0 and "\\x1b]0;owned" in r.stdout
    r = _trace("--last", "1", "--state-dir", str(state), "--json")
    assert r.returncode == 0 and r.stdout.isascii() and json.loads(r.stdout)[0]["message"] == "refused" + HOSTILE


# ------------------------------------------------------------------ rejected samples


def _sample(state: Path, trace_id: str, meta: dict | None = None, payload: bytes = b'{"v":1}') -> Path:
    d = state / "rejected"
    d.mkdir(exist_ok=True)
    meta = meta or {"time_ms": 1767254400123, "type": "invalid", "code": 1003, "name": "UNKNOWN_TYPE",
                    "message": "unknown" + HOSTILE, "request_id": None, "trace_id": trace_id,
                    "client": {"identity": "00", "connection": 1, "peer": "p" + HOSTILE},
                    "frames": [{"size": len(payload), "kept": len(payload), "truncated": False}],
                    "frames_total": 1, "truncated": False}
    (d / f"{trace_id}.json").write_text(json.dumps(meta))
    (d / f"{trace_id}.bin").write_bytes(payload)
    return d


def test_a_rejected_sample_is_read_as_the_journal_is(state):
    d = _sample(state, BAD, payload=b'{"v":1,"type":"\x1b[2J\xe2\x80\xae"}')
    r = _trace(BAD, "--state-dir", str(state))  # only a sample: its fields escaped too
    assert r.returncode == 0 and "\\x1b" in r.stdout and "\\u202e" in r.stdout, r.stderr
    assert json.loads(_trace(BAD, "--state-dir", str(state), "--json").stdout)["message"] == "unknown" + HOSTILE
    os.unlink(d / f"{BAD}.json")
    os.mkfifo(d / f"{BAD}.json")
    r = _trace(BAD, "--state-dir", str(state))
    assert r.returncode == 1 and "a FIFO, not a regular file" in r.stderr
    os.unlink(d / f"{BAD}.json")
    _sample(state, BAD)
    os.unlink(d / f"{BAD}.bin")
    os.symlink("/dev/zero", d / f"{BAD}.bin")
    r = _trace(BAD, "--state-dir", str(state), "--json")
    assert r.returncode == 1 and "symbolic link" in r.stderr
    _sample(state, OLD, meta={"frames": 5, "trace_id": OLD})
    (d / f"{OLD}.bin").unlink()
    (d / f"{OLD}.bin").write_bytes(b"{" * 4096)
    r = _trace(OLD, "--state-dir", str(state))
    assert r.returncode == 1 and "'frames' is not a list" in r.stderr


# ------------------------------------------------------------------ the reader, in-process


def test_the_chunked_reader_finds_what_a_plain_parse_finds(state):
    """A 6 MiB segment of good lines with bad ones between them (over-long ones across the reads'
    chunk boundaries too): ``last`` returns every good entry, in order, each with its lineage;
    ``find`` finds any of them; ``extent`` counts every entry line; the skips are counted."""
    from edge.observability.journal import reader
    from edge.observability.journal.checks import MAX_LINE, Skipped

    journal = state / "journal"
    template, lineage = _template(journal)
    lines, good = [lineage], []
    bad = [fn(template) for fn in LINES.values()]
    i = size = 0
    while size < 6 << 20:
        tid = f"{i:016x}"
        added = [_entry(template, tid, i)] + ([bad[(i // 97) % len(bad)]] if i % 97 == 0 else [])
        lines += added
        good.append(tid)
        size += sum(map(len, added))
        i += 1
    lines.append(_entry(template, "f" * 16, "torn")[:40])  # a torn last line: not counted anywhere
    path = _add_segment(journal, lines)
    path.write_bytes(path.read_bytes()[:-1])
    d = str(journal)
    skipped = Skipped()
    got = reader.last(d, len(good), skipped)
    assert [e["t"] for e, _ in got] == good and all(lin == LINEAGE for _, lin in got)
    assert skipped.entries == sum(1 for line in lines if line in bad) and not skipped.files
    assert f"longer than {MAX_LINE} bytes" in skipped.lines
    for tid in (good[0], good[1], good[len(good) // 2], good[-1]):
        found = reader.find(d, tid)
        assert found is not None and found.entry["t"] == tid and found.lineage == LINEAGE
    assert reader.find(d, "f" * 16) is None
    x = reader.extent(d)
    assert x["entries"] == 60 + sum(line.startswith(b'{"t":') for line in lines[:-1])
    assert x["newest_ms"] == template["ts"]


def test_lone_surrogates_are_escaped_not_a_unicode_error(state):
    journal = state / "journal"
    template, lineage = _template(journal)
    raw = _entry(template, OLD, "x", msg="MSG", k="KIND")
    raw = raw.replace(b'"MSG"', b'"a\\ud800b"').replace(b'"KIND"', b'"\xed\xa0\x80"')  # escaped, and as bytes
    _add_segment(journal, [lineage, raw])
    r = _trace(OLD, "--state-dir", str(state))
    assert r.returncode == 0 and "a\\ud800b" in r.stdout and "trace 0123456789abc0de  \\ud800  " in r.stdout, r.stderr
    r = _trace(OLD, "--state-dir", str(state), "--json")
    assert r.returncode == 0 and r.stdout.isascii() and json.loads(r.stdout)["message"] == "a\ud800b"
