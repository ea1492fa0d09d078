"""The tokenizer stage: one thread between the I/O thread and the engine loop.

Tokenizing is the one per-request cost that grows with the input (up to 64 texts of 32 KiB
each), so it does not run on the I/O thread: there it kept ``health`` unanswered for 46 s
behind one hostile request. The I/O thread validates a request, counts its bytes
(:meth:`Admission.reserve`), records it as in flight and hands it here; this thread tokenizes
it (the tokenizer stops at the model's maximum), counts it against the queue bound and passes
it on to the engine loop as :class:`Admit`. A refusal (EMPTY_TEXT, TOO_MANY_TOKENS, OVERLOADED)
goes back through the engine loop's outbox as :class:`Failed`, and the I/O thread answers it
like any other result. A :class:`Cancel` is passed on in the order it came, so it never
overtakes the request it names.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

from edge.errors import EdgeError, ErrorCode
from edge.system.log import log_exception
from edge.serving.admission import Admission
from edge.serving.metrics import Metrics
from edge.serving.request import Admit, Cancel, Failed, Request

__all__ = ["TokenizeStage"]


class TokenizeStage:
    def __init__(self, admission: Admission, forward: Callable[[Any], None], outbox: deque,
                 metrics: Metrics) -> None:
        self.admission = admission
        self.forward = forward  # the engine loop's submit()
        self.outbox = outbox  # the engine loop's outbox: refusals go back with the results
        self.metrics = metrics
        self.wake: Callable[[], None] = lambda: None  # set by the transport, as the engine loop's
        self._intake: deque = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def submit(self, item: Request | Cancel) -> None:
        """Thread-safe: a request to tokenize, or a cancel to pass on after it."""
        with self._cond:
            self._intake.append(item)
            self._cond.notify()

    def start(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self._thread = threading.Thread(target=self._run, name="edge-tokenize", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> bool:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._intake and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                item = self._intake.popleft()
            if isinstance(item, Cancel):
                self.forward(item)
            else:
                self._tokenize(item)

    def _tokenize(self, request: Request) -> None:
        texts, request.texts_in = request.texts_in, None  # the ids replace them: free the text now
        try:
            if request.released:  # answered while it waited (drain timeout): no work, no reply
                return
            assert texts is not None  # set on arrival (ServingCore); only this stage drops them
            self.admission.fill(request, texts)
            if self.admission.admit(request):
                self.metrics.accepted(request.texts)
                self.forward(Admit(request))
        except EdgeError as exc:
            self._refuse(request, exc.code, exc.message)
        except Exception as exc:  # a tokenizer bug must cost one request, not the stage
            log_exception("tokenize.failed", level="error", trace_id=request.trace_id)
            self._refuse(request, ErrorCode.INTERNAL, f"tokenizing failed: {type(exc).__name__}"[:300])
        finally:
            self.admission.unreserve(request.text_bytes)

    def _refuse(self, request: Request, code: ErrorCode, message: str) -> None:
        request.finished = True  # never admitted: a cancel that follows finds nothing to cancel
        self.outbox.append(Failed(request, code, message))
        self.wake()
