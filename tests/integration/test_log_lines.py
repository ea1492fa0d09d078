"""The runtime's log, as journald gets it (docs/protocol.md; edge/system/log.py): every line of stdout is
one JSON object with ts, level and event; a line about a request carries that request's trace
id, at debug; at the default level (info) no line is written per request."""

from __future__ import annotations

import json

import pytest

from support.runtime_proc import start_runtime

from edge.errors import EdgeError
from edge.ipc.client import EdgeClient


def _lines(rt) -> list[dict]:
    out = []
    for line in rt.output().splitlines():
        if line.strip():
            out.append(json.loads(line))  # a line that is not JSON fails here
    return out


@pytest.mark.parametrize("level", ["debug", "info"])
def test_request_lines_carry_the_trace_id_at_debug_only(minilm_package, tmp_path, level):
    rt = start_runtime(tmp_path, "--package", str(minilm_package), "--engine", "onnxruntime", "--log-level", level)
    try:
        rt.wait_ready()
        client = EdgeClient(rt.address, timeout_s=30)
        try:
            result = client.embed(["a request the log names by its trace id"])
            with pytest.raises(EdgeError) as refused:
                client.embed([""])  # EMPTY_TEXT: an error reply
        finally:
            client.close()
    finally:
        rt.stop()
    lines = _lines(rt)
    assert lines and all({"ts", "level", "event"} <= set(line) for line in lines)
    by_event = {}
    for line in lines:
        by_event.setdefault(line["event"], []).append(line)
    assert by_event["boot.ready"][0]["level"] == "info"
    ok_trace, error_trace = result.meta["trace_id"], getattr(refused.value, "trace_id", None)
    if level == "info":
        assert "reply.result" not in by_event and "reply.error" not in by_event
        return
    results = [line for line in by_event["reply.result"] if line["trace_id"] == ok_trace]
    errors = [line for line in by_event["reply.error"] if line["trace_id"] == error_trace]
    assert len(results) == 1 and results[0]["level"] == "debug", by_event.get("reply.result")
    assert len(errors) == 1 and errors[0]["level"] == "debug" and error_trace, by_event.get("reply.error")
