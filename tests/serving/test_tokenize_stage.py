"""The tokenizer stage between the I/O thread and the engine loop: order, refusals, bounds."""

from __future__ import annotations

import threading
import time
from collections import deque

import pytest

from edge.errors import ErrorCode, FlowError
from edge.serving.admission import Admission
from edge.serving.metrics import Metrics
from edge.serving.request import Admit, Cancel, Failed, Request
from edge.serving.shapes import BatchShapes
from edge.serving.tokenize_stage import TokenizeStage
from edge.preload.serving_settings import ServingSettings
from support.ipc_fakes import FakeTokenizer

SETTINGS = {"buckets": [8, 16], "max_batch_size": 4, "max_queue_requests": 8, "max_queue_tokens": 1024,
            "max_pending_text_bytes": 100}


class Gate(FakeTokenizer):
    """Tokenizes only while the gate is open: the stage's queue can be filled first."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def encode(self, text, max_length=None):
        self.open.wait(10)
        return super().encode(text, max_length)


@pytest.fixture
def stage():
    shapes = BatchShapes(ServingSettings.model_validate(SETTINGS), max_seq_length=16)
    tok = Gate()
    admission = Admission(tok, shapes)
    forwarded, outbox = [], deque()
    st = TokenizeStage(admission, forwarded.append, outbox, Metrics(shapes.buckets))
    st.start(lambda: None)
    st.tok, st.forwarded, st.outbox = tok, forwarded, outbox
    yield st
    tok.open.set()
    st.stop(5)


def _request(stage: TokenizeStage, texts: list[str], **kw) -> Request:
    n = sum(len(t.encode()) for t in texts)
    stage.admission.reserve(n)
    r = Request([], [], time.monotonic(), texts_in=texts, text_bytes=n, **kw)
    stage.submit(r)
    return r


def _settle(stage: TokenizeStage, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(stage.forwarded) + len(stage.outbox) < n and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_cancel_never_overtakes_the_request_it_names(stage):
    r = _request(stage, ["a b c"])
    cancel = Cancel(r, reply_to=None)
    stage.submit(cancel)
    stage.tok.open.set()
    _settle(stage, 2)
    assert [type(m) for m in stage.forwarded] == [Admit, Cancel] and stage.forwarded[0].request is r
    assert r.texts_in is None and r.tokens == [5] and stage.admission.pending_bytes == 0


def test_a_refused_text_comes_back_as_failed_and_frees_its_bytes(stage):
    r = _request(stage, ["fine", " ".join("w" * 20)], truncate=False)  # 22 ids, the maximum is 16
    stage.tok.open.set()
    _settle(stage, 1)
    (failed,) = stage.outbox
    assert isinstance(failed, Failed) and failed.request is r and r.finished
    assert failed.code == ErrorCode.TOO_MANY_TOKENS and "texts[1]" in failed.message
    assert stage.forwarded == [] and stage.admission.pending_bytes == 0 and stage.admission.texts == 0


def test_a_request_answered_while_it_waited_is_not_tokenized(stage):
    r = _request(stage, ["late text"])
    stage.admission.release(r)  # a drain timed out and answered it
    stage.tok.open.set()
    other = _request(stage, ["next one"])
    _settle(stage, 1)
    assert [m.request for m in stage.forwarded] == [other] and stage.outbox == deque()
    assert stage.admission.texts == 1  # only the other one counts against the queue bound


def test_the_tokenizer_backlog_is_bounded_in_bytes(stage):
    _request(stage, ["x" * 60])
    with pytest.raises(FlowError) as info:
        _request(stage, ["y" * 60])
    assert info.value.code == ErrorCode.OVERLOADED and "backlog" in info.value.message
    stage.tok.open.set()
    _settle(stage, 1)
    assert stage.admission.pending_bytes == 0
    _request(stage, ["y" * 60])  # room again once tokenized
