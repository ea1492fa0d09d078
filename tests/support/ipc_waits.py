"""Waits of the in-process serving tests: on the server's own state, asked over the socket."""

from __future__ import annotations

import time

from edge.ipc.client import EdgeClient


def wait_in_flight(server, n: int, timeout_s: float = 5.0) -> None:
    """Until the server holds ``n`` requests, asked over a connection of its own (AssertionError after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    with EdgeClient(server.address, timeout_s=timeout_s) as h:
        while (held := h.health()["queue"]["in_flight"]) != n:
            assert time.monotonic() < deadline, f"{held} requests in flight after {timeout_s} s, not {n}"
            time.sleep(0.002)  # poll interval
