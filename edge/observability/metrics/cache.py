"""The exposition, rendered at most once per interval (docs/metrics.md, Limits).

A render reads every metric family once (:meth:`EdgeCollector.collect`: the serving metrics'
lock, the admission's, the scheduler's queues) and formats it: a few milliseconds of Python
that hold the GIL the serving threads need too. So the families read by one render are kept
with the bytes formatted from them, and every scrape and file write within ``max_age_s`` of
that render is served from them:

* one render per interval whatever the number of scrapers: the first scrape after the
  interval renders, on its own connection's thread; scrapes that come while it renders get
  the previous text at once (never two renders at a time, never a scraper waiting for one);
* each wire format (text 0.0.4, OpenMetrics, gzipped or not) is formatted at most once per
  render, from the same families, so every format of one render says the same; at most
  ``MAX_FORMATS`` of them per render (the Accept header chooses, and it is the client's):
  beyond them a scrape gets the text format 0.0.4, uncompressed;
* ``fresh=True`` (the textfile's last write at shutdown) renders again, whatever the age.

Imported after READY only (it imports ``prometheus_client``), by :mod:`edge.observability.metrics.publish`.
"""

from __future__ import annotations

import gzip
import threading
import time
from typing import Any, Callable

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest, gzip_accepted

__all__ = ["Exposition", "MAX_FORMATS", "TEXT"]

MAX_FORMATS = 4  # (content type, gzip) bodies formatted per render, the fallback text 0.0.4 aside
TEXT = CONTENT_TYPE_PLAIN_0_0_4  # the text format 0.0.4: the textfile's, and the fallback


class _Render:
    """The families one render read, and the bodies formatted from them, by (content type, gzip)."""

    def __init__(self, at: float, families: list) -> None:
        self.at = at
        self.families = families
        self.bodies: dict[tuple[str, bool], bytes] = {}
        self.lock = threading.Lock()  # one format of a kind at a time: a second caller waits for it

    def collect(self) -> list:  # what an encoder reads, as from a registry
        return self.families


class Exposition:
    """``registry`` rendered at most once per ``max_age_s`` (seconds, > 0)."""

    def __init__(self, registry: Any, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.max_age_s = max_age_s
        self.clock = clock
        self.renders = 0  # registry reads so far (tests, and the cost's own check)
        self.formats = 0  # bodies formatted so far
        self._last: _Render | None = None
        self._rendering = threading.Lock()  # held by the one thread that reads the registry
        self._begun = 0  # renders begun (under _rendering): "fresh" asks for one begun after the call

    def body(self, accept: str | None = None, accept_encoding: str | None = None,
             fresh: bool = False) -> tuple[bytes, str, bool]:
        """``(data, content type, gzipped)`` for a scrape with these headers (None: the text
        format 0.0.4, not compressed); ``fresh``: from a render that started after this call."""
        encoder, content_type = choose_encoder(accept or "")
        return self._format(self._render(fresh), encoder, content_type, gzip_accepted(accept_encoding or ""))

    def text(self, fresh: bool = False) -> bytes:
        """The text format 0.0.4 (what node_exporter's textfile collector reads)."""
        return self.body(fresh=fresh)[0]

    def _render(self, fresh: bool) -> _Render:
        asked, begun = self.clock(), self._begun
        last = self._last
        if last is not None and not fresh and asked - last.at < self.max_age_s:
            return last
        # Stale or absent: one thread reads the registry; while it does, the others get the
        # previous render, or wait when there is none yet (or they asked for a fresh one).
        if not self._rendering.acquire(blocking=last is None or fresh):
            assert last is not None  # only a non-blocking try fails: there is a last render
            return last
        try:
            last = self._last  # another thread may have rendered while this one waited
            if last is None or (self._begun == begun if fresh else self.clock() - last.at >= self.max_age_s):
                self._begun += 1
                last = _Render(self.clock(), list(self.registry.collect()))
                self.renders += 1
                self._last = last
            return last
        finally:
            self._rendering.release()

    def _format(self, r: _Render, encoder: Callable, content_type: str, gzipped: bool) -> tuple[bytes, str, bool]:
        key = (content_type, gzipped)
        with r.lock:
            if key not in r.bodies and len(r.bodies) >= MAX_FORMATS:  # see the module's docstring
                encoder, content_type, gzipped = generate_latest, TEXT, False
                key = (TEXT, False)
            if key not in r.bodies:
                data = encoder(r)
                r.bodies[key] = gzip.compress(data) if gzipped else data
                self.formats += 1
            return r.bodies[key], content_type, gzipped
