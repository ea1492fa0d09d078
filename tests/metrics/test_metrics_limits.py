"""The metrics endpoint's limits, in process (docs/metrics.md, Limits): the render cache (one
render per interval, whatever the scrapes), and the listener's deadline, eviction and pace.
The same attacks on the real runtime: tests/hostile/test_metrics_attacks.py."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import urllib.request

import pytest

from edge.observability.metrics import publish as MP
from edge.observability.metrics.cache import MAX_FORMATS, TEXT, Exposition
from edge.observability.metrics.export import registry_for
from edge.observability.metrics.http import MetricsListener, _Conn, _DeadlineIO
from edge.observability.metrics.publish import MetricsPublisher
from support.prometheus import samples, value

OPENMETRICS = "application/openmetrics-text;version=1.0.0"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """A registry whose one counter says how many times it was read; ``gate``: collect() waits
    for it (a render that takes its time)."""

    def __init__(self) -> None:
        self.reads = 0
        self.gate: threading.Event | None = None
        self.reading = threading.Event()

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        self.reads += 1
        self.reading.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        c = CounterMetricFamily("edge_reads_total", "Registry reads")
        c.add_metric([], self.reads)
        yield c


def _reads(data: bytes) -> float:
    return value(samples(data), "edge_reads_total")


# ------------------------------------------------------------------ the render cache


def test_two_scrapes_in_one_interval_render_once_and_the_text_changes_after_it(fake_server, client):
    clock = Clock()
    publisher = MetricsPublisher(registry_for(fake_server))
    publisher.exposition = Exposition(publisher.registry, MP.RENDER_INTERVAL_S, clock=clock)
    publisher.start_listener("127.0.0.1", 0)
    url = "http://%s:%d/metrics" % publisher.address
    try:
        first = urllib.request.urlopen(url, timeout=5).read()
        client(fake_server).embed(["a b c"])  # counted at once by the metrics, not by the text yet
        clock.now += MP.RENDER_INTERVAL_S * 0.9
        second = urllib.request.urlopen(url, timeout=5).read()
        assert second == first and publisher.exposition.renders == 1
        assert value(samples(second), "edge_replies_ok_total", type="infer") == 0
        clock.now += MP.RENDER_INTERVAL_S * 0.1  # the interval is over
        third = urllib.request.urlopen(url, timeout=5).read()
        assert publisher.exposition.renders == 2 and third != first
        assert value(samples(third), "edge_replies_ok_total", type="infer") == 1
    finally:
        publisher.stop()


def test_the_interval_is_1_s_or_the_textfile_interval_when_shorter(fake_server, tmp_path):
    registry = registry_for(fake_server)
    assert MetricsPublisher(registry).exposition.max_age_s == MP.RENDER_INTERVAL_S == 1.0
    assert MetricsPublisher(registry, textfile_dir=str(tmp_path), interval_s=0.05).exposition.max_age_s == 0.05


def test_the_textfile_and_the_scrapes_share_one_render_and_the_last_write_is_fresh(fake_server, tmp_path):
    publisher = MetricsPublisher(registry_for(fake_server), textfile_dir=str(tmp_path), interval_s=3600)
    publisher.start()  # the first write renders
    publisher.start_listener("127.0.0.1", 0)
    try:
        body = urllib.request.urlopen("http://%s:%d/metrics" % publisher.address, timeout=5).read()
        assert body == (tmp_path / "edge.prom").read_bytes() and publisher.exposition.renders == 1
    finally:
        fake_server.request_drain()
        assert fake_server.wait(10)
        publisher.stop()
    assert publisher.exposition.renders == 2  # the last write: a render after the drain
    assert value(samples((tmp_path / "edge.prom").read_bytes()), "edge_state", state="stopped") == 1


def test_a_scrape_while_another_renders_gets_the_last_text_without_waiting():
    clock, registry = Clock(), Counting()
    exp = Exposition(registry, 1.0, clock=clock)
    assert _reads(exp.text()) == 1
    clock.now += 1.0
    registry.gate = threading.Event()
    renderer = threading.Thread(target=exp.text)
    renderer.start()
    try:
        assert registry.reading.wait(5)  # the second render is under way, and waits
        t0 = time.monotonic()
        assert _reads(exp.text()) == 1 and _reads(exp.body(OPENMETRICS)[0]) == 1  # the last one, at once
        assert time.monotonic() - t0 < 1.0 and registry.reads == 2  # never two renders at a time
    finally:
        registry.gate.set()
        renderer.join(5)
    assert _reads(exp.text()) == 2 and registry.reads == 2


def test_fresh_renders_again_within_the_interval():
    exp = Exposition(Counting(), 1.0, clock=Clock())
    assert _reads(exp.text()) == 1 and _reads(exp.text()) == 1
    assert _reads(exp.text(fresh=True)) == 2 and exp.renders == 2


def test_every_format_of_one_render_says_the_same_and_their_number_is_bounded(fake_server):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    clock = Clock()
    exp = Exposition(registry_for(fake_server), 1.0, clock=clock)
    text, ctype, gz = exp.body()
    assert (ctype, gz) == (TEXT, False)
    om, om_type, om_gz = exp.body(OPENMETRICS, "gzip")
    assert om_type.startswith("application/openmetrics-text") and om_gz
    om_samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for f in text_string_to_metric_families(gzip.decompress(om).decode()) for s in f.samples}
    assert value(om_samples, "edge_uptime_seconds") == value(samples(text), "edge_uptime_seconds")
    assert exp.body(OPENMETRICS, "gzip")[0] is om  # formatted once
    for v in range(MAX_FORMATS + 3):  # an Accept header may name any version: a new body each
        exp.body(f"application/openmetrics-text;version=1.0.{v + 1}")
    assert exp.formats == MAX_FORMATS and exp.renders == 1
    assert exp.body("application/openmetrics-text;version=1.0.99") == (text, TEXT, False)
    clock.now += 1.0
    assert exp.body(OPENMETRICS)[1].startswith("application/openmetrics-text") and exp.renders == 2


# ------------------------------------------------------------------ the listener


def _listener(fake_server, **limits) -> MetricsListener:
    limits = {"clients": 4, "timeout_s": 5.0, "head_grace_s": 1.0, "accepts_per_s": 1000.0, **limits}
    listener = MetricsListener("127.0.0.1", 0, Exposition(registry_for(fake_server), 1.0), **limits)
    listener.start()
    return listener


def _closed_after(s: socket.socket, t0: float, drip: bytes = b"", limit_s: float = 5.0) -> float:
    """Seconds from ``t0`` until the server closes ``s``, sending ``drip`` every 0.05 s meanwhile."""
    s.settimeout(0.05)
    while time.monotonic() - t0 < limit_s:
        try:
            if s.recv(1) == b"":
                break
        except socket.timeout:
            pass
        if drip:
            try:
                s.sendall(drip)
            except OSError:
                break
    return time.monotonic() - t0


def test_a_head_sent_a_byte_at_a_time_is_closed_at_the_deadline(fake_server):
    """Each read gets its byte within 0.05 s: a timeout per read would never fire."""
    listener = _listener(fake_server, timeout_s=0.5)
    try:
        s = socket.create_connection(listener.address, timeout=5)
        t0 = time.monotonic()
        s.sendall(b"GET /metrics HTTP/1.0\r\nX-slow: ")
        held = _closed_after(s, t0, drip=b"x")
        s.close()
        assert 0.4 < held < 1.5, held
    finally:
        listener.stop()


def test_a_reply_read_slowly_is_cut_at_the_deadline():
    """The reply's writes share the deadline: a client that does not read loses the connection."""
    a, b = socket.socketpair()
    try:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn = _Conn(a, None, 0.3)
        raw = _DeadlineIO(conn)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            raw.write(b"x" * (8 << 20))  # b never reads
        assert 0.2 < time.monotonic() - t0 < 1.0
        with pytest.raises(TimeoutError):  # past the deadline: no read or write waits at all
            raw.readinto(bytearray(10))
    finally:
        a.close()
        b.close()


def test_when_every_slot_is_taken_a_newcomer_takes_the_slowest_heads(fake_server):
    listener = _listener(fake_server, head_grace_s=0.3)
    idle = []
    try:
        idle = [socket.create_connection(listener.address, timeout=5) for _ in range(4)]
        t0 = time.monotonic()
        time.sleep(0.1)
        extra = socket.create_connection(listener.address, timeout=5)  # within the grace: refused
        extra.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert extra.recv(100) == b""
        extra.close()
        time.sleep(0.3)
        with urllib.request.urlopen("http://%s:%d/metrics" % listener.address, timeout=5) as r:
            assert r.status == 200 and b"edge_build_info" in r.read()
        assert _closed_after(idle[0], t0, limit_s=2.0) < 2.0  # the oldest gave its slot up
        for s in idle[1:]:  # the others keep theirs (until their deadline)
            s.settimeout(0.05)
            with pytest.raises(socket.timeout):
                s.recv(1)
    finally:
        for s in idle:
            s.close()
        listener.stop()


def test_accepts_are_paced(fake_server):
    """5 a second, bursts of 4: 12 scrapes one after the other take (12 - 4) / 5 = 1.6 s at least."""
    listener = _listener(fake_server, accepts_per_s=5.0)
    url = "http://%s:%d/metrics" % listener.address
    try:
        t0 = time.monotonic()
        for _ in range(12):
            urllib.request.urlopen(url, timeout=5).read()
        took = time.monotonic() - t0
    finally:
        listener.stop()
    assert 1.5 < took < 5.0, took
