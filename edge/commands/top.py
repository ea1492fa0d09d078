"""``edge top``: a live terminal view of one runtime, refreshed from its ``stats`` every ``--interval``.

A client of the running server (protocol v1, docs/protocol.md); nothing is added to the
protocol. Two polls of ``stats`` and the seconds between them become a View
(``edge/commands/top_model.py``, pure functions); ``edge/commands/top_view.py`` draws a View with rich;
the loop here polls, builds and redraws. What each field means: docs/top.md.

Rates and the "last interval" figures are differences of the server's counters and histogram
counts between two polls, so the server keeps no per-client state and two ``edge top`` on one
runtime do not disturb each other (each counts the other's ``stats`` requests, never as infer).

Imported by ``edge``'s parser: standard library only at module level; rich only in :func:`run`.
"""

from __future__ import annotations

import errno
import sys
import time

from edge.commands.top_model import build_view, no_answer_view

__all__ = ["add_arguments", "run"]

MISSING_RICH = "edge top: needs the rich package, which edge[top] installs: pip install 'edge[top]'"


def add_arguments(p) -> None:
    """``edge top``'s own options (``--connect``, ``--timeout`` and the keys come from edge/cli.py)."""
    from edge.config.argtypes import positive_number

    p.add_argument("--interval", type=positive_number("seconds"), default=1.0, metavar="S",
                   help="seconds between two polls of stats; rates are over this interval (default 1)")
    p.add_argument("--once", action="store_true",
                   help="print one frame and exit, for scripts: two polls --interval apart, so that it has rates; "
                        "exit 2 when the server does not answer")
    p.add_argument("--no-color", action="store_true", help="no colours (also when NO_COLOR is set)")


class _Poller:
    """One client of ``address``; :meth:`poll` returns (stats or None, why not)."""

    def __init__(self, address: str, curve, timeout_s: float) -> None:
        from edge.ipc.client import EdgeClient

        self.address, self.timeout_s = address, timeout_s
        self.client = EdgeClient(address, timeout_s=timeout_s, curve=curve)

    def poll(self) -> tuple[dict | None, str]:
        from edge.errors import EdgeError
        from edge.ipc.endpoint import check_ipc_server

        try:
            check_ipc_server(self.address)  # no socket file: say so at once, not after a timeout
            return self.client.stats(timeout_s=self.timeout_s), ""
        except FileNotFoundError as exc:
            # check_ipc_server always sets strerror; str(exc) only for a FileNotFoundError built without one.
            return None, "its socket file does not exist" if exc.errno == errno.ENOENT else exc.strerror or str(exc)
        except TimeoutError:
            return None, f"no reply within {self.timeout_s:g} s"
        except EdgeError as exc:
            return None, f"stats refused: {exc}"


def _frames(poller: _Poller, interval_s: float, sleep=time.sleep):
    """Yield a View per poll, forever; the polls are ``interval_s`` apart (start to start)."""
    prev, prev_t, last = None, None, None
    while True:
        t = time.monotonic()
        stats, why = poller.poll()
        if stats is None:
            last = no_answer_view(poller.address, last, f"no answer from {poller.address} (retrying): {why}")
            prev = None  # the next answer may come from a restarted server
        else:
            last = build_view(prev, stats, t - prev_t if prev_t is not None else None, poller.address)
            prev, prev_t = stats, t
        yield last
        sleep(max(0.0, t + interval_s - time.monotonic()))


def run(args, address: str, curve) -> int:
    """``edge top`` with a normalized ``address`` and the client's keys (edge/cli.py)."""
    try:
        from rich.console import Console
        from rich.live import Live

        from edge.commands.top_view import render
    except ImportError:
        sys.stderr.write(MISSING_RICH + "\n")
        return 2
    console = Console(no_color=True if args.no_color else None, highlight=False)
    poller = _Poller(address, curve, getattr(args, "timeout", 5.0))
    try:
        if args.once:
            return _once(poller, args.interval, console, render)
        frames = _frames(poller, args.interval)
        with Live(f"asking {address} for stats", console=console, auto_refresh=False) as live:
            for view in frames:
                live.update(render(view), refresh=True)
    except KeyboardInterrupt:  # the way to leave a live view: not an interruption to report
        return 0
    finally:
        poller.client.close()
    return 0


def _once(poller: _Poller, interval_s: float, console, render) -> int:
    first, why = poller.poll()
    if first is None:
        sys.stderr.write(f"edge top: no answer from {poller.address}: {why} (is the server running? check "
                         f"--connect or EDGE_ADDRESS)\n")
        return 2
    t0 = time.monotonic()
    time.sleep(interval_s)
    second, _ = poller.poll()
    view = build_view(first, second, time.monotonic() - t0, poller.address) if second is not None else \
        build_view(None, first, None, poller.address)
    console.print(render(view))
    return 0
