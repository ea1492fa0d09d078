"""Issue 26, item 5: filling the state directory with refused requests' samples must not switch
the journal off. The real runtime (MiniLM, ONNX Runtime) keeps its state on a small real tmpfs
with ``--keep-rejected``; over-long texts and normal requests fill it. Serving goes on (every
request answered), the loss is counted in ``stats``, and once space is freed the journal resumes
by itself: ``edge trace`` finds a new reply and its sample. Needs root (the mount), else skipped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from edge.ipc import protocol as P
from edge.ipc.client import EdgeClient
from support.runtime_proc import start_runtime
from support.tmpfs import fill, tmpfs

OVERLONG = P.encode_request("infer", {"texts": ["y" * (P.Limits().max_text_bytes + 1)]})
DEADLINE_S = 30.0  # for each state the test waits for; reached in a few seconds here


def _trace(trace_id: str, state: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "edge.cli", "trace", trace_id, "--json", "--state-dir", str(state)],
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def _until(what: str, predicate, rt, deadline_s: float = DEADLINE_S):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {deadline_s} s: {what}\n{rt.output(40)}")


def test_a_full_state_directory_pauses_the_journal_and_it_resumes_when_space_is_freed(minilm_package, tmp_path):
    with tmpfs(tmp_path / "state", 4 << 20) as state:
        # The default cap (256 MiB) is far above this disk: the disk fills first, as in the issue.
        rt = start_runtime(tmp_path / "rt", "--package", str(minilm_package), "--engine", "onnxruntime",
                           "--state-dir", str(state), "--keep-rejected", "10000")
        try:
            rt.wait_ready()
            filler = fill(state / "filler", leave_bytes=1 << 20)
            asked = answered = 0
            with EdgeClient(rt.address, timeout_s=60) as client:

                def traffic() -> dict:
                    nonlocal asked, answered
                    for _ in range(25):
                        client.send_frames(OVERLONG)
                        asked += 1
                        reply = client.recv()
                        assert reply.is_error and reply.body["code"] == 1006, reply.body  # TEXT_TOO_LONG
                        answered += 1
                    asked += 1
                    assert client.embed(["the conveyor belt sensors report normal"]).embeddings.shape == (1, 384)
                    answered += 1
                    return client.stats()["journal"]

                def both(paused: bool):
                    j = traffic()
                    return j if j["paused"] == paused and j["rejected"]["paused"] == paused else None

                j = _until("both halves of the journal paused for lack of space", lambda: both(True), rt)
                assert answered == asked and rt.proc.poll() is None  # serving went on
                assert j["enabled"] and j["rejected"]["enabled"] and not j["errors"]
                assert j["dropped_by_reason"]["no_space"] > 0 and j["rejected"]["lost"] > 0, j
                assert j["write_errors"] >= 2 and j["rejected"]["written"] > 0

                filler.unlink()  # space comes back: the journal tries again after its wait
                j = _until("the journal writing again", lambda: both(False), rt)
                fresh = client.embed(["traced after the disk was freed"], request_id="after")
                client.send_frames(OVERLONG)
                refused = client.recv().body["trace_id"]
            e = _until("edge trace finds the new reply", lambda: _trace(fresh.meta["trace_id"], state), rt)
            assert e["code"] == 0 and e["request_id"] == "after" and e["texts"] == 1
            e = _until("edge trace finds the new refusal", lambda: _trace(refused, state), rt)
            assert e["code"] == 1006 and e["rejected_sample"]["truncated"] is True
            assert rt.stop() == 0, rt.output()
            log = [json.loads(x) for x in rt.output(None).splitlines() if x.startswith("{")]
            events = [x for x in log if x["event"].startswith("journal.")]
            assert {x["part"] for x in events if x["event"] == "journal.paused"} == {"journal", "rejected"}
            assert {x["part"] for x in events if x["event"] == "journal.resumed"} == {"journal", "rejected"}
            assert not [x for x in events if x["event"] == "journal.disabled"], events
        finally:
            rt.stop()
