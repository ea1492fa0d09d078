"""The runtime's numbers in Prometheus' text format (docs/metrics.md lists every metric).

One exposition path: :class:`EdgeCollector` reads what the ``stats`` reply reads, at each
render (at most once per interval, whatever the scrapes: :mod:`edge.observability.metrics.cache`), and
turns it into metric families:

* :meth:`edge.serving.metrics.Metrics.snapshot` (requests, replies, latencies, batches);
* admission's counters and the scheduler's queue lengths (queue depth);
* the boot timeline, the lineage (build info) and the lifecycle state;
* the device telemetry dict, when the runtime samples one (:func:`telemetry_families`).

Conventions: base units (seconds, bytes, ratios 0-1), ``_total`` counters, histograms with
``_bucket``/``_sum``/``_count``, a HELP and a TYPE line each; no timestamps (node_exporter's
textfile collector refuses them). ``prometheus_client`` costs ~60-100 ms of import, so this
module is imported only after READY and only when a ``--metrics-*`` flag asks for it
(:mod:`edge.observability.metrics.publish`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from edge.errors import ErrorCode
from edge.observability.metrics.control import breaker_families, journal_families
from edge.serving.metrics import PHASES

__all__ = ["EdgeCollector", "render", "snapshot_families", "queue_families", "boot_families", "build_info",
           "telemetry_families", "journal_families", "registry_for", "LINEAGE_LABELS"]

# Error codes a reply can carry (1xxx-3xxx): exported at 0 from the start, so that a rate()
# over them has a series before the first error. Boot codes (4xxx) never reach the wire.
_WIRE_CODES = [c for c in ErrorCode if int(c) < 4000]
LINEAGE_LABELS = ("edge_version", "edge_commit", "model", "model_sha256", "tokenizer_sha256", "package_sha256",
                  "bundle_sha256", "engine", "device")
_STATES = ("booting", "ready", "draining", "stopped")  # edge.ipc.server.Lifecycle's values


# ------------------------------------------------------------------ Metrics.snapshot()


def _cumulative(h: dict, scale: float = 1.0) -> list[tuple[str, int]]:
    """A snapshot histogram's per-bucket counts (the last one above every bound) as cumulative
    ``(le, count)`` pairs; ``scale`` converts its unit (ms -> s: 0.001)."""
    buckets, seen = [], 0
    for bound, c in zip(list(h["bounds"]) + [math.inf], h["counts"]):
        seen += c
        le = "+Inf" if bound == math.inf else floatToGoString(round(bound * scale, 9))
        buckets.append((le, seen))
    return buckets


def _histogram(name: str, doc: str, h: dict, scale: float = 1.0) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=_cumulative(h, scale), sum_value=h["sum"] * scale)


def _phase_histogram(lat: dict) -> HistogramMetricFamily:
    """The phases of answered infer requests (load, transfer, forward, post; docs/trace.md), one
    labelled family: they add up to edge_request_duration_seconds."""
    fam = HistogramMetricFamily("edge_request_phase_seconds", "Per answered infer request, by phase: load (arrival "
                                "to the engine loop: decode, tokenize), transfer (waiting for its batch, staging), "
                                "forward (the engine), post (batch end to reply sent)", labels=["phase"])
    for phase in PHASES:
        if lat.get(phase):
            fam.add_metric([phase], _cumulative(lat[phase], 0.001), lat[phase]["sum"] * 0.001)
    return fam


def _batch_size_histogram(sizes: dict, caps: Iterable[int]) -> HistogramMetricFamily:
    """Texts per batch from exact counts: bounds at powers of two up to the largest cap."""
    top = max([int(k) for k in sizes] + list(caps) + [1])
    bounds = [1 << i for i in range(top.bit_length() + 1) if 1 << i < top] + [top]
    buckets = [(floatToGoString(b), sum(n for k, n in sizes.items() if int(k) <= b)) for b in bounds]
    buckets.append(("+Inf", sum(sizes.values())))
    return HistogramMetricFamily("edge_batch_size", "Texts per batch the engine ran (real rows, padding rows "
                                 "not counted)", buckets=buckets,
                                 sum_value=float(sum(int(k) * n for k, n in sizes.items())))


def snapshot_families(snap: dict, caps: Iterable[int] = ()) -> Iterator[Metric]:
    """Families of a :meth:`Metrics.snapshot` dict. ``caps``: the rows a batch may hold per
    bucket (bounds of the batch-size histogram)."""
    g = GaugeMetricFamily("edge_uptime_seconds", "Seconds since the serving core was built")
    g.add_metric([], snap["uptime_s"])
    yield g
    c = CounterMetricFamily("edge_requests_total", "Messages received, by type (invalid: refused while parsing)",
                            labels=["type"])
    for t, n in snap["requests"].items():
        c.add_metric([t], n)
    yield c
    c = CounterMetricFamily("edge_replies_ok_total", "Successful replies sent, by message type", labels=["type"])
    for t, n in snap["replies_ok"].items():
        c.add_metric([t], n)
    yield c
    c = CounterMetricFamily("edge_replies_error_total", "Error replies sent, by error code and name",
                            labels=["code", "name"])
    errors = {int(code): 0 for code in _WIRE_CODES}
    names = {int(code): code.name for code in _WIRE_CODES}
    for e in snap["errors"]:
        errors[int(e["code"])] = e["count"]
        names[int(e["code"])] = e["name"]
    for code in sorted(errors):
        c.add_metric([str(code), names[code]], errors[code])
    yield c
    c = CounterMetricFamily("edge_replies_dropped_total", "Replies never sent: hwm (the client's queue was full, "
                            "it does not read) or unroutable (the client was gone)", labels=["reason"])
    for reason, n in snap["replies_dropped_by_reason"].items():
        c.add_metric([reason], n)
    yield c
    c = CounterMetricFamily("edge_texts_accepted_total", "Texts tokenized and queued for the engine")
    c.add_metric([], snap["texts_accepted"])
    yield c
    lat = snap["latency_ms"]
    yield _histogram("edge_request_queue_seconds", "Per answered infer request: arrival to the start of the "
                     "batch that ran it", lat["queue"], 0.001)
    yield _histogram("edge_batch_compute_seconds", "Per batch: the engine's run time", lat["compute"], 0.001)
    yield _histogram("edge_request_duration_seconds", "Per answered infer request: arrival to the reply handed "
                     "to the socket", lat["total"], 0.001)
    yield _phase_histogram(lat)
    batches = snap["batches"]
    per_bucket = {
        "batches": ("edge_batches_total", "Batches the engine ran, by bucket (tokens per row)"),
        "texts": ("edge_batch_texts_total", "Texts (real rows) in the batches run, by bucket"),
        "rows": ("edge_batch_rows_total", "Rows the engine computed, padding rows included, by bucket"),
        "tokens": ("edge_batch_tokens_total", "Real tokens in the batches run, by bucket"),
        "padded_tokens": ("edge_batch_padded_tokens_total", "Tokens the engine computed (rows x bucket length), "
                          "by bucket"),
    }
    for key, (name, doc) in per_bucket.items():
        c = CounterMetricFamily(name, doc, labels=["bucket"])
        for bucket, s in batches["by_bucket"].items():
            value = s["padded_tokens"] // int(bucket) if key == "rows" else s[key]
            c.add_metric([str(bucket)], value)
        yield c
    c = CounterMetricFamily("edge_engine_failures_total", "Batches whose engine run raised (ENGINE_FAILED)")
    c.add_metric([], batches["engine_failures"])
    yield c
    if batches["padding_efficiency"] is not None:  # no batch yet: no ratio
        g = GaugeMetricFamily("edge_padding_efficiency_ratio", "Real tokens / tokens computed, over every batch "
                              "since start (1: no padding)")
        g.add_metric([], batches["padding_efficiency"])
        yield g
    yield _batch_size_histogram(batches["sizes"], caps)


# ------------------------------------------------------------------ queue, boot, lineage, state


def queue_families(admission: dict, per_bucket: dict[int, int]) -> Iterator[Metric]:
    """Queue depth: ``admission`` is :meth:`Admission.info`; ``per_bucket`` the texts waiting in
    each bucket's queue of the scheduler."""
    g = GaugeMetricFamily("edge_queue_texts", "Texts waiting in the scheduler's queue, by bucket", labels=["bucket"])
    for bucket, n in sorted(per_bucket.items()):
        g.add_metric([str(bucket)], n)
    yield g
    gauges = (
        ("edge_admitted_texts", "Texts admitted and not yet answered (queued or running)", "texts"),
        ("edge_admitted_texts_limit", "Bound on admitted texts (max_queue_requests)", "max_texts"),
        ("edge_admitted_tokens", "Padded tokens of the admitted texts", "tokens"),
        ("edge_admitted_tokens_limit", "Bound on admitted padded tokens (max_queue_tokens)", "max_queued_tokens"),
        ("edge_pending_text_bytes", "UTF-8 bytes of text received and not yet tokenized", "pending_text_bytes"),
        ("edge_pending_text_bytes_limit", "Bound on text bytes waiting for the tokenizer (max_pending_text_bytes)",
         "max_pending_text_bytes"),
    )
    for name, doc, key in gauges:
        if admission.get(key) is not None:
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], admission[key])
            yield g


def boot_families(timeline: dict | None) -> Iterator[Metric]:
    """The boot timeline: each stage's duration, and exec to READY."""
    if not isinstance(timeline, dict):
        return
    g = GaugeMetricFamily("edge_boot_stage_seconds", "Duration of each boot stage (stages of the engine thread "
                          "overlap those of the main thread)", labels=["stage"])
    durations: dict[str, float] = {}
    for s in timeline.get("stages") or ():
        if isinstance(s, dict) and isinstance(s.get("duration_ms"), (int, float)):
            name = str(s.get("stage", "?"))
            durations[name] = durations.get(name, 0.0) + s["duration_ms"] / 1000.0  # a repeated stage: summed
    for name, seconds in durations.items():
        g.add_metric([name], seconds)
    yield g
    ready = timeline.get("exec_to_ready_ms")
    if isinstance(ready, (int, float)):
        g = GaugeMetricFamily("edge_boot_exec_to_ready_seconds", "From exec (or the snapshot's restore) to READY")
        g.add_metric([], ready / 1000.0)
        yield g
    g = GaugeMetricFamily("edge_boot_restored", "1 when this process was restored from a snapshot, 0 when it "
                          "booted fresh")
    g.add_metric([], 1 if timeline.get("start") == "restored" else 0)
    yield g


def build_info(lineage: dict) -> GaugeMetricFamily:
    g = GaugeMetricFamily("edge_build_info", "Always 1; the labels name the code, the package and the bundle "
                          "every reply comes from (its lineage)", labels=list(LINEAGE_LABELS))
    g.add_metric([str(lineage.get(k) or "") for k in LINEAGE_LABELS], 1)
    return g


def state_family(state: str) -> GaugeMetricFamily:
    g = GaugeMetricFamily("edge_state", "1 for the server's lifecycle state, 0 for the others", labels=["state"])
    for s in _STATES:
        g.add_metric([s], 1 if s == state else 0)
    return g


# ------------------------------------------------------------------ telemetry


class _Gauges:
    """Gauge families built up sample by sample: a value that is not a finite number, or a
    label set seen before, is left out; a family with no sample is never emitted."""

    def __init__(self) -> None:
        self.families: dict[str, GaugeMetricFamily] = {}
        self._labels: dict[str, tuple] = {}  # family -> its label names
        self._seen: set[tuple] = set()

    def add(self, name: str, doc: str, value: Any, labels: dict[str, Any] | None = None, scale: float = 1.0) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        labels = {k: "" if v is None else str(v) for k, v in (labels or {}).items()}
        key = (name, tuple(sorted(labels.items())))
        if key in self._seen or self._labels.setdefault(name, tuple(labels)) != tuple(labels):
            return
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = GaugeMetricFamily(name, doc, labels=list(labels))
        self._seen.add(key)
        fam.add_metric(list(labels.values()), value * scale)


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def telemetry_families(t: Any) -> Iterator[Metric]:
    """Gauges of the ``telemetry`` dict of ``stats`` (edge/observability/telemetry/: a sample of sysfs, NVML,
    /proc). Read defensively: any section or key may be missing, None or of another type, and
    what is not there is left out, never exported as 0. Units go to base units (% -> ratio,
    mV -> V, mA -> A, kHz/MHz -> Hz, ms -> s)."""
    if not isinstance(t, dict):
        return
    g = _Gauges()
    p = "edge_telemetry_"
    gpu = _dict(t.get("gpu"))  # a Jetson's integrated GPU (devfreq)
    if gpu:
        label = {"gpu": gpu.get("name") or gpu.get("devfreq") or "gpu"}
        g.add(p + "gpu_load_ratio", "GPU busy share (0-1)", gpu.get("load_pct"), label, 0.01)
        g.add(p + "gpu_frequency_hertz", "GPU clock", gpu.get("cur_freq_hz"), label)
        g.add(p + "gpu_max_frequency_hertz", "Highest GPU clock the governor may set", gpu.get("max_freq_hz"), label)
    nvml = t.get("nvml")
    for i, d in enumerate(nvml if isinstance(nvml, list) else ()):  # discrete GPUs
        d = _dict(d)
        label = {"gpu": d.get("index", i)}
        g.add(p + "gpu_load_ratio", "GPU busy share (0-1)", d.get("load_pct"), label, 0.01)
        g.add(p + "gpu_frequency_hertz", "GPU clock", d.get("clock_mhz"), label, 1e6)
        g.add(p + "gpu_temperature_celsius", "GPU temperature (NVML)", d.get("temp_c"), label)
        g.add(p + "gpu_power_watts", "GPU board power (NVML)", d.get("power_w"), label)
        g.add(p + "gpu_memory_used_bytes", "GPU memory in use (NVML)", d.get("memory_used_bytes"), label)
        g.add(p + "gpu_memory_total_bytes", "GPU memory (NVML)", d.get("memory_total_bytes"), label)
    for zone, celsius in _dict(t.get("thermal_c")).items():
        g.add(p + "temperature_celsius", "Thermal zone temperature, by zone type", celsius, {"zone": zone})
    for rail, r in _dict(t.get("power")).items():  # INA3221 rails overlap (VDD_IN holds the others)
        r = _dict(r)
        g.add(p + "power_watts", "Power of an INA3221 rail (do not add rails up)", r.get("power_w"), {"rail": rail})
        g.add(p + "power_volts", "Bus voltage of an INA3221 rail", r.get("voltage_mv"), {"rail": rail}, 1e-3)
        g.add(p + "power_amperes", "Current of an INA3221 rail", r.get("current_ma"), {"rail": rail}, 1e-3)
    mem = _dict(t.get("memory"))
    for key in ("total", "available", "used", "swap_total", "swap_free"):
        g.add(f"{p}memory_{key}_bytes", f"System memory: {key.replace('_', ' ')} (/proc/meminfo; shared with "
              f"the GPU on a Jetson)", mem.get(f"{key}_bytes"))
    cpu = _dict(t.get("cpu"))
    g.add(p + "cpu_load_ratio", "Busy share of all CPUs between two samples (0-1)", cpu.get("load_pct"), None, 0.01)
    if isinstance(cpu.get("online"), list):
        g.add(p + "cpus_online", "CPUs online (nvpmodel takes some offline)", len(cpu["online"]))
    for n, khz in _dict(cpu.get("freq_khz")).items():
        g.add(p + "cpu_frequency_hertz", "CPU clock, by CPU", khz, {"cpu": n}, 1e3)
    proc = _dict(t.get("process"))
    g.add(p + "process_resident_memory_bytes", "The runtime's resident memory", proc.get("rss_bytes"))
    g.add(p + "process_resident_memory_peak_bytes", "The runtime's peak resident memory", proc.get("rss_peak_bytes"))
    g.add(p + "process_threads", "The runtime's threads", proc.get("threads"))
    mode = _dict(t.get("nvpmodel"))
    if mode.get("id") is not None:
        g.add(p + "power_mode_info", "Always 1; the labels name the nvpmodel power mode",
              1, {"id": mode.get("id"), "name": mode.get("name")})
    dev = _dict(t.get("device"))
    if dev:
        g.add(p + "device_info", "Always 1; the labels name the device (model, L4T release)", 1,
              {"model": dev.get("model"), "l4t": dev.get("l4t"), "jetson": "1" if dev.get("jetson") else "0"})
    g.add(p + "age_seconds", "Age of the telemetry sample when read", t.get("age_ms"), None, 1e-3)
    g.add(p + "read_seconds", "Time the sample took to read", t.get("read_ms"), None, 1e-3)
    g.add(p + "interval_seconds", "Seconds between two samples (--telemetry-interval)", t.get("interval_s"))
    yield from g.families.values()


# ------------------------------------------------------------------ the collector


class EdgeCollector:
    """A ``prometheus_client`` collector over a running :class:`edge.ipc.server.IpcServer`.

    Reads, never writes: the metrics and admission take their own locks; the scheduler's
    queue lengths are read without the engine loop's knowledge (``len()`` of a list, atomic
    under the GIL). The loop moves texts into those queues between batches, so texts that
    arrive while a batch runs show there when it ends (``edge_admitted_texts`` counts them at once)."""

    def __init__(self, server: Any, telemetry: Callable[[], dict | None] | None = None) -> None:
        self.server = server
        self.telemetry = telemetry  # default: the ``telemetry`` of the server's extra stats fields

    def _telemetry(self) -> Any:
        if self.telemetry is not None:
            return self.telemetry()
        extra = getattr(self.server, "extra_stats", None)  # edge.observability.telemetry's sampler sets it after READY
        return _dict(extra() if extra else None).get("telemetry")

    def collect(self) -> Iterator[Metric]:
        server, core = self.server, self.server.core
        caps = [core.shapes.rows(b) for b in core.shapes.buckets]
        yield from snapshot_families(server.metrics.snapshot(), caps)
        yield from queue_families(core.admission.info(), {b: core.scheduler.queued(b) for b in core.shapes.buckets})
        yield state_family(server.state.value)
        journal = getattr(server, "journal", None)
        yield from journal_families(journal.info() if journal is not None else None)
        yield from breaker_families(core.breaker.snapshot() if getattr(core, "breaker", None) else None)
        yield build_info(server.lineage.as_dict())
        try:
            yield from boot_families(server.timeline() if server.timeline else None)
        except Exception:  # a timeline that cannot be read: the other metrics still go out
            pass
        try:
            sample = self._telemetry()
        except Exception:  # telemetry is a guest here: its failure leaves its gauges out, nothing else
            sample = None
        yield from telemetry_families(sample)


def registry_for(server: Any, telemetry: Callable[[], dict | None] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EdgeCollector(server, telemetry))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The text exposition format (0.0.4), what node_exporter's textfile collector reads."""
    return generate_latest(registry)
