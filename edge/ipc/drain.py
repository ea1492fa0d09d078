"""The last reads before the serving socket closes (docs/protocol.md, "Shutdown").

Once a drain has nothing left in flight, the I/O thread reads the ROUTER until it is empty and
answers every message it finds (an ``infer`` with SHUTTING_DOWN), and only then closes it, with
LINGER so those replies leave. Without these reads, whatever libzmq had already taken off the
connections (in the socket's pipes, delivered but not yet read) went down with the socket: 63
of 400 large requests, SIGTERM 1 s after they were sent (issue 26, item 9).

Why the connections are not shut first. ``zmq_unbind`` would stop new messages, but it also
closes every connection accepted on that endpoint: what their pipes hold can still be read, and
every reply to it fails with EHOSTUNREACH (measured, libzmq 4.3.5). ZeroMQ gives a ROUTER no way
to stop a connection's input while keeping its output. So new *connections* stop (the caller
removes the ipc socket file first; open connections keep working both ways), and the open ones
are read until they fall silent:

* until no message has come for ``quiet_s``: a client still writing a burst delivers its next
  message well within that (a 2 MiB message crosses an ipc socket in 0.8 ms here, 1.8 ms at
  p95), so the reads do not stop in the middle of one. A message that arrives after that
  silence and before the close is not read: the one window left, as long as the close itself,
  since libzmq moves data from the kernel into the pipes on its own threads.
* for ``max_s`` and ``max_bytes`` at most, however much keeps coming: a client that keeps
  sending (a flood) cannot hold the shutdown open. What it sends past either bound is not read.
  Without such a client the bounds are far away: a burst stands in the pipes only once, and
  the reads answer it at about 1,100 requests of 500 KB a second here (400 in 330-390 ms,
  tests/hostile/test_drain.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, cast

import zmq

__all__ = ["FinalReads", "read_to_the_end"]


@dataclass(frozen=True, slots=True)
class FinalReads:
    """Bounds of the last reads; their sum with the drain timeout, the engine loop's stop (2 s)
    and LINGER is how long a stop takes at most (edge/boot.py waits drain timeout + 5 s)."""

    quiet_s: float = 0.05  # s with no message that ends the reads
    max_s: float = 1.0  # s of reading at most
    max_bytes: int = 512 << 20  # bytes read at most (128 requests at the 4 MiB frame limit)


def read_to_the_end(router: zmq.Socket, handle: Callable[[list[zmq.Frame]], None],
                    bounds: FinalReads = FinalReads()) -> dict:
    """Read ``router`` without blocking and ``handle`` every message until it stays empty for
    ``bounds.quiet_s`` or a bound is reached; returns what was read, for the shutdown log line."""
    start = time.monotonic()
    end = start + bounds.max_s
    read = nbytes = 0
    cut = None  # "time" or "bytes": a bound ended the reads, not the silence
    while True:
        left = end - time.monotonic()
        if left <= 0 or nbytes >= bounds.max_bytes:
            cut = "time" if left <= 0 else "bytes"
            break
        try:
            frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            if not router.poll(int(min(bounds.quiet_s, left) * 1000.0), zmq.POLLIN):  # whole ms, as pyzmq truncates
                break  # silence (up to the time bound at most)
            continue
        read += 1
        nbytes += sum(len(f) for f in frames)
        handle(frames)
    unread = bool(cut) and bool(cast(int, router.getsockopt(zmq.EVENTS)) & zmq.POLLIN)  # EVENTS: an int option
    return {"read": read, "bytes": nbytes, "ms": round((time.monotonic() - start) * 1000.0, 1), "cut": cut,
            "left_unread": unread}
