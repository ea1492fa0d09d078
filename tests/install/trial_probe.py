"""What a scenario in the trial's machine (tests/support/trial_machine.py) uses: runs inside
systemd-nspawn, as probe.service, with this checkout's venv python, imported as ``trial_probe``
(the unit's PYTHONPATH is this directory alone). The unit's name is in ``EDGE_UNIT``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

UNIT = os.environ["EDGE_UNIT"]
BUNDLE = "/opt/edge/bundle/current"
BIN = os.path.dirname(sys.executable)
RESULT: dict = {"unit": UNIT}


def sh(*cmd: str, timeout: float = 300, env: dict | None = None) -> dict:
    t0 = time.monotonic()
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr[-3000:], "started": t0,
            "seconds": round(time.monotonic() - t0, 3)}


def edge_bundle(*args: str, timeout: float = 300, env: dict | None = None) -> dict:
    return sh(f"{BIN}/edge-bundle", *args, timeout=timeout, env=env)


def selftest() -> dict:
    """`edge selftest --json` against the live bundle, as the trial runs it (its report)."""
    r = sh(f"{BIN}/edge", "selftest", "--json", "--connect", address(), "--timeout", "60")
    try:
        return {**json.loads(r["out"]), "rc": r["rc"]}
    except ValueError:
        return {"rc": r["rc"], "error": r["err"]}


def supervisor_settled(timeout_s: float = 240.0) -> dict:
    """edge-supervise's start record once its background snapshot, if any, has ended (the machine
    is quiet again, so what is measured next is not that snapshot's work)."""
    def settled():
        try:
            with open("/run/edge-supervise/start.json") as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        return record if record.get("snapshot") not in (None, "taking") else None
    return wait_for(settled, timeout_s, 0.2) or {}


def status() -> dict:
    r = edge_bundle("status", "--json")
    try:
        report = json.loads(r["out"])
    except ValueError:
        return {"rc": r["rc"], "error": r["err"]}
    report["rc"] = r["rc"]
    return report


def address() -> str:
    with open(os.path.join(BUNDLE, "edge-bundle.json")) as f:
        return json.load(f)["address"]


def _live_digest() -> str | None:
    """The bundle digest of the slot `edge-bundle status` calls live (None: no such record)."""
    report = status()
    record = (report.get("slots") or {}).get(report.get("live")) or {}
    return record.get("bundle_sha256")


def serving(timeout_s: float = 60.0) -> dict:
    """Wait until the runtime answers ready from the bundle status calls live; the digest its
    lineage reports. A rollback or switch writes the state first and queues the unit's restart
    after, so for a moment the runtime still serving is the one before: wait that out, on the
    runtime's own answer, instead of taking it (or, when the restart never comes, return it)."""
    from edge.ipc.client import EdgeClient

    deadline = time.monotonic() + timeout_s
    last, digest = None, None
    while time.monotonic() < deadline:
        client = EdgeClient(address(), timeout_s=1.0)
        try:
            if client.health(timeout_s=1.0).get("ready"):
                stats = client.stats(timeout_s=5.0)
                digest = stats["lineage"]["bundle_sha256"]
                live = _live_digest()
                if live is None or digest == live:
                    timeline = stats.get("timeline") or {}
                    return {"bundle_sha256": digest, "start": timeline.get("start"),
                            "exec_to_ready_ms": timeline.get("exec_to_ready_ms"),
                            "waited_s": round(timeout_s - (deadline - time.monotonic()), 3)}
                last = f"serving {digest[:12]} while the live slot holds {live[:12]}"
        except Exception as exc:  # noqa: BLE001 - not up yet: the socket, a timeout
            last = repr(exc)
        finally:
            client.close()
        time.sleep(0.1)
    return {"bundle_sha256": digest, "error": last}


def wait_for(predicate, timeout_s: float, step_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step_s)
    return None


def wait_health(word: str, timeout_s: float = 120.0) -> dict:
    """`edge-bundle status` until its health is ``word``; the last report."""
    last = {}

    def check():
        nonlocal last
        last = status()
        return last.get("health") == word

    wait_for(check, timeout_s, 0.5)
    return last


class HealthPoller(threading.Thread):
    """``health`` every ``period_s`` with a fresh connection; the longest time between two ready
    answers is the runtime's outage as a client sees it. Each probe's send time, round trip and
    answer are kept (``samples``) for the latency of a window (:meth:`latency`)."""

    def __init__(self, period_s: float = 0.02) -> None:
        super().__init__(daemon=True)
        import zmq

        self.zmq = zmq
        self.ctx = zmq.Context.instance()
        self.period_s = period_s
        self.oks: list[float] = []
        self.fails = 0
        self.samples: list[tuple[float, float, bool]] = []  # (monotonic at the send, seconds to the answer, ready)
        self.stopping = threading.Event()

    def _one(self, addr: str) -> bool:
        from edge.ipc.client import EdgeClient

        client = EdgeClient(addr, timeout_s=0.5, context=self.ctx)
        try:
            return bool(client.health(timeout_s=0.5).get("ready"))
        except Exception:  # noqa: BLE001 - down: refused, timed out
            return False
        finally:
            client.close()

    def run(self) -> None:
        addr = address()
        while not self.stopping.is_set():
            t0 = time.monotonic()
            ok = self._one(addr)
            self.samples.append((t0, time.monotonic() - t0, ok))
            if ok:
                self.oks.append(time.monotonic())
            else:
                self.fails += 1
            time.sleep(self.period_s)

    def longest_gap(self, since: float) -> tuple[float, float]:
        """(the last ready answer before, the first after) the longest time without one, after ``since``
        (monotonic): an update's outage, the old runtime's stop to the new one's first answer."""
        oks = [t + d for t, d, ok in self.samples if ok and t + d >= since]
        if len(oks) < 2:
            return since, since
        return max(zip(oks, oks[1:]), key=lambda ab: ab[1] - ab[0])

    def latency(self, since: float, until: float) -> dict:
        """The round trips of the probes sent in [since, until) (monotonic): n, failed, p50, p99, max (ms);
        a probe that got no ready answer counts as its whole wait."""
        window = [(d * 1000, ok) for t, d, ok in self.samples if since <= t < until]
        times = sorted(ms for ms, _ in window)
        if not times:
            return {"n": 0}
        pick = lambda q: round(times[min(len(times) - 1, int(q * len(times)))], 2)  # noqa: E731
        return {"n": len(times), "failed": sum(not ok for _, ok in window), "p50_ms": pick(0.5),
                "p99_ms": pick(0.99), "max_ms": round(times[-1], 2), "seconds": round(until - since, 3)}

    def stop(self) -> dict:
        self.stopping.set()
        self.join(5)
        gaps = [b - a for a, b in zip(self.oks, self.oks[1:])]
        return {"answers": len(self.oks), "failures": self.fails, "max_gap_s": round(max(gaps, default=0.0), 3)}


class InferLoad(threading.Thread):
    """One app on one connection, kept open, sending ``infer`` requests back to back: what an update
    does to an app that is connected when it begins. Each request's outcome: answered (ok, or an
    error code's name) or no reply within ``timeout_s`` (then the client reconnects)."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.timeout_s = timeout_s
        self.outcomes: dict[str, int] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        from edge.errors import EdgeError
        from edge.ipc.client import EdgeClient

        client = EdgeClient(address(), timeout_s=self.timeout_s)
        try:
            while not self.stopping.is_set():
                try:
                    client.embed(["an app's request during the update"])
                    outcome = "ok"
                except EdgeError as exc:
                    outcome = exc.code.name
                    time.sleep(0.01)
                except TimeoutError:
                    outcome = "no_reply"
                self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        finally:
            client.close()

    def stop(self) -> dict:
        self.stopping.set()
        self.join(self.timeout_s + 5)
        return dict(self.outcomes)


def finish() -> None:
    with open("/out/result.json", "w") as f:
        json.dump(RESULT, f, indent=2)
