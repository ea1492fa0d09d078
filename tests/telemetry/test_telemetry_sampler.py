"""The sampler (a thread that samples; ``latest()`` that reads nothing), the optional sources
(jtop's service, NVML) with fakes in their place, and the ``--telemetry-interval`` setting."""

from __future__ import annotations

import builtins
import datetime
import io
import os
import socket
import textwrap
import time
from pathlib import Path

import pytest

from edge.config.env import DEFAULT_TELEMETRY_INTERVAL_S, ENVIRONMENT

from edge.runtime.serve_args import parse_serve_args
from edge.observability.telemetry import JtopSource, NvmlSource, Sampler, start_sampler
from edge.observability.telemetry.sampler import read_all

ORIN = str(Path(__file__).resolve().parent / "fixtures" / "orin")


class _Off:
    """A source that is never there (keeps tests off the machine's own jtop and NVML)."""

    status = "off in this test"

    def read(self):
        return None

    def close(self):
        pass


def _sampler(interval_s: float = 2.0, root: str = ORIN) -> Sampler:
    return Sampler(interval_s, root, jtop=_Off(), nvml=_Off())


def _no_io(*_a, **_k):
    raise AssertionError("latest() did I/O")


def test_latest_does_no_io(monkeypatch):
    s = _sampler()
    assert s.latest() is None
    assert s.stats_fields() == {"telemetry": {"interval_s": 2.0, "samples": 0, "pending": "no sample yet"}}
    first = s.sample()
    for target, name in ((builtins, "open"), (io, "open"), (os, "open"), (os, "listdir"), (os, "scandir"),
                         (os, "stat"), (os, "lstat"), (os.path, "exists"), (os.path, "realpath")):
        monkeypatch.setattr(target, name, _no_io)
    for _ in range(3):
        latest = s.latest()
        assert {k: v for k, v in latest.items() if k != "age_ms"} == first
        assert latest["age_ms"] >= 0.0
        assert s.stats_fields()["telemetry"]["gpu"]["load_pct"] == 45.3
    with pytest.raises(AssertionError, match="did I/O"):  # the patch does bite
        s.sample()


def test_sample_fields_and_cpu_load(tmp_path):
    s = _sampler(root=str(tmp_path))
    (tmp_path / "proc").mkdir()
    stat = tmp_path / "proc" / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0\n")
    first = s.sample()
    assert first["cpu"]["load_pct"] is None  # needs two samples
    assert first["samples"] == 1 and first["interval_s"] == 2.0 and first["read_ms"] >= 0
    assert abs(first["at"] - time.time()) < 60
    stat.write_text("cpu  150 0 150 850 50 0 0 0 0 0\n")  # +100 busy of +200 (iowait is idle)
    assert s.sample()["cpu"]["load_pct"] == 50.0


def test_thread_samples_until_stopped():
    s = _sampler(interval_s=0.05).start()
    try:
        deadline = time.monotonic() + 10
        while s.samples < 3:
            assert time.monotonic() < deadline, "no 3 samples in 10 s"
            time.sleep(0.01)
        assert s._thread.name == "edge-telemetry" and s._thread.daemon
    finally:
        s.stop()
    assert not s._thread.is_alive()
    n = s.samples
    time.sleep(0.15)
    assert s.samples == n


def test_a_reader_bug_keeps_the_last_sample(monkeypatch):
    s = _sampler(interval_s=0.05)
    good = s.sample()
    monkeypatch.setattr("edge.observability.telemetry.sampler.read_all", lambda *a: 1 / 0)
    s.start()
    try:
        deadline = time.monotonic() + 10
        while s.failures < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        s.stop()
    assert s.latest()["samples"] == good["samples"]


def test_start_sampler_sets_the_servers_hook():
    class Server:
        extra_stats = None

    server = Server()
    assert start_sampler(server, 0) is None and server.extra_stats is None
    sampler = start_sampler(server, 60.0, root=ORIN)
    try:
        assert server.extra_stats == sampler.stats_fields
    finally:
        sampler.stop()
    with pytest.raises(ValueError):
        Sampler(0)


# ------------------------------------------------------------------ jtop


FAKE_JTOP = """
import datetime, time

class jtop:
    def __init__(self):
        self.closed = False
    def start(self):
        {start}
    def is_alive(self):
        return not self.closed
    @property
    def stats(self):
        return {{"time": datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc),
                 "uptime": datetime.timedelta(seconds=90), "GPU": 45.3, "EMC": 12, "nvp model": "15W",
                 "CPU1": "OFF", "Temp tj": 46.2}}
    def close(self):
        self.closed = True
"""


def _fake_jtop(tmp_path, monkeypatch, name: str, start: str = "pass") -> str:
    (tmp_path / "mods").mkdir(exist_ok=True)
    (tmp_path / "mods" / f"{name}.py").write_text(textwrap.dedent(FAKE_JTOP.format(start=start)))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    return name


def _service(root: Path, listen: bool = True) -> socket.socket:
    (root / "run").mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(root / "run" / "jtop.sock"))
    if listen:
        sock.listen(4)
    return sock


def test_jtop_not_installed_or_no_service(tmp_path, monkeypatch):
    src = JtopSource(str(tmp_path), module="edge_test_no_such_jtop")
    assert src.read() is None and src.status == "jetson-stats is not installed (pip install 'edge[jetson]')"
    src = JtopSource(str(tmp_path), module=_fake_jtop(tmp_path, monkeypatch, "jtop_fake_a"))
    assert src.read() is None
    assert src.status == "no /run/jtop.sock: the jtop service is not running (or not mounted in the bundle)"
    stale = _service(tmp_path, listen=False)  # a socket file nobody accepts on: the service died
    try:
        src = JtopSource(str(tmp_path), module="jtop_fake_a")
        assert src.read() is None and src.status == "/run/jtop.sock does not answer: Connection refused"
    finally:
        stale.close()


def test_jtop_answers(tmp_path, monkeypatch):
    service = _service(tmp_path)
    try:
        src = JtopSource(str(tmp_path), module=_fake_jtop(tmp_path, monkeypatch, "jtop_fake_b"))
        stats = src.read()
        assert src.status == "ok"
        assert stats == {"time": datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc).timestamp(),
                         "uptime": 90.0, "GPU": 45.3, "EMC": 12, "nvp model": "15W", "CPU1": "OFF", "Temp tj": 46.2}
        sample = read_all(ORIN, src, None)
        assert sample["jtop"] == stats and sample["sources"]["jtop"] == "ok" and "jtop" not in sample["absent"]
        client = src._client
        client.closed = True  # the service went away: back to sysfs alone, tried again later
        assert src.read() is None and src.status == "jtop stopped answering: RuntimeError: the jtop client stopped"
        assert src._client is None and client.closed
        assert src.read() is None  # within retry_s: not tried again
    finally:
        service.close()


def test_jtop_client_that_hangs_or_fails(tmp_path, monkeypatch):
    service = _service(tmp_path)
    try:
        hang = _fake_jtop(tmp_path, monkeypatch, "jtop_fake_c", start="time.sleep(0.5)")
        src = JtopSource(str(tmp_path), start_timeout_s=0.05, module=hang)
        t0 = time.monotonic()
        assert src.read() is None
        assert time.monotonic() - t0 < 0.4
        assert src.status == "the jtop client did not start within 0.05 s"
        fail = _fake_jtop(tmp_path, monkeypatch, "jtop_fake_d", start="raise RuntimeError('jtop.service is not active')")
        src = JtopSource(str(tmp_path), module=fail, retry_s=0.0)
        assert src.read() is None
        assert src.status == "the jtop client failed to start: RuntimeError: jtop.service is not active"
    finally:
        service.close()


# ------------------------------------------------------------------ NVML


def test_nvml_without_a_driver():
    src = NvmlSource("libedge-test-no-such-nvml.so.1")
    assert src.read() is None and src.status.startswith("libedge-test-no-such-nvml.so.1 does not load")


class _FakeNvml:
    """What the sampler calls of libnvidia-ml, answering through the ctypes pointers it is given."""

    def __init__(self, init: int = 0) -> None:
        self.init = init
        self.shutdown = 0

    @staticmethod
    def _set(ref, **fields):
        obj = ref._obj
        for k, v in fields.items():
            setattr(obj, k, v)
        return 0

    def nvmlInit_v2(self):
        return self.init

    def nvmlErrorString(self, code):
        return b"Driver Not Loaded"

    def nvmlShutdown(self):
        self.shutdown += 1

    def nvmlDeviceGetCount_v2(self, ref):
        return self._set(ref, value=1)

    def nvmlDeviceGetHandleByIndex_v2(self, index, ref):
        return self._set(ref, value=0x1000 + index.value)

    def nvmlDeviceGetName(self, handle, buf, size):
        buf.value = b"NVIDIA H200"
        return 0

    def nvmlDeviceGetUtilizationRates(self, handle, ref):
        return self._set(ref, gpu=37, memory=12)

    def nvmlDeviceGetMemoryInfo(self, handle, ref):
        return self._set(ref, total=150 << 30, free=100 << 30, used=50 << 30)

    def nvmlDeviceGetTemperature(self, handle, sensor, ref):
        return self._set(ref, value=41)

    def nvmlDeviceGetPowerUsage(self, handle, ref):
        return self._set(ref, value=123456)

    def nvmlDeviceGetClockInfo(self, handle, clock, ref):
        return 3  # NVML_ERROR_NOT_SUPPORTED


def test_nvml_fake_device():
    lib = _FakeNvml()
    src = NvmlSource(loader=lambda name: lib)
    assert src.read() == [{"index": 0, "name": "NVIDIA H200", "load_pct": 37.0, "memory_load_pct": 12.0,
                           "memory_total_bytes": 150 << 30, "memory_used_bytes": 50 << 30, "temp_c": 41.0,
                           "power_w": 123.456, "clock_mhz": None}]
    assert src.status == "ok"
    src.close()
    assert lib.shutdown == 1
    failing = NvmlSource(loader=lambda name: _FakeNvml(init=9))
    assert failing.read() is None and failing.status == "nvmlInit_v2: Driver Not Loaded"


def test_nvml_only_off_a_jetson(tmp_path):
    src = NvmlSource(loader=lambda name: _FakeNvml())
    assert read_all(ORIN, None, src)["nvml"] is None  # a Jetson: devfreq, not NVML
    sample = read_all(str(tmp_path), None, src)
    assert sample["nvml"][0]["name"] == "NVIDIA H200" and sample["sources"]["nvml"] == "ok"


# ------------------------------------------------------------------ the setting


def test_telemetry_interval_setting(capsys):
    assert parse_serve_args([], env={}).telemetry_interval == DEFAULT_TELEMETRY_INTERVAL_S == 2.0
    assert parse_serve_args(["--telemetry-interval", "0"], env={}).telemetry_interval == 0.0
    assert parse_serve_args([], env={"EDGE_TELEMETRY_INTERVAL": "5"}).telemetry_interval == 5.0
    assert parse_serve_args(["--telemetry-interval=1"], env={"EDGE_TELEMETRY_INTERVAL": "5"}).telemetry_interval == 1
    assert ENVIRONMENT["EDGE_TELEMETRY_INTERVAL"] == "edge serve --telemetry-interval"
    for bad in ("0.01", "-1", "nan", "inf"):
        with pytest.raises(SystemExit) as exc:
            parse_serve_args(["--telemetry-interval", bad], env={})
        assert exc.value.code == 2
        assert "--telemetry-interval: give 0 (off) or seconds from 0.1 to 86400" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_serve_args([], env={"EDGE_TELEMETRY_INTERVAL": "often"})
    assert "EDGE_TELEMETRY_INTERVAL" in capsys.readouterr().err
