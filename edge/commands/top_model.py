"""``edge top``'s model: two polls of ``stats`` and the seconds between them become a :class:`View`
(pure functions, no terminal: :func:`build_view`). ``edge/commands/top_view.py`` draws a View with
rich; ``edge/commands/top.py`` polls, builds and redraws. What each field means: docs/top.md.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["DeviceView", "Latency", "BucketRow", "View", "build_view", "device_view", "interval_histogram",
           "no_answer_view", "quantile", "HISTOGRAMS", "QUANTILES"]

HISTOGRAMS = ("queue", "compute", "total")  # stats' latency_ms keys, in the order shown
QUANTILES = (0.5, 0.95, 0.99)
# Power rails that measure the whole board's input: the total, not one more part of it
# (Orin's VDD_IN; Nano, TX2 and Xavier call it POM_5V_IN).
TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")


@dataclass
class Latency:
    """Percentiles of one latency histogram (ms): upper bounds of the buckets that hold them."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    count: int = 0  # observations behind them


@dataclass
class BucketRow:
    """One sequence-length bucket: its batches and how full they ran."""

    bucket: int  # tokens per row
    cap: int | None  # rows per batch the server allows in this bucket (settings.batch_caps)
    batches: int  # since boot
    texts: int  # since boot
    fill: float | None  # texts / (batches x cap), since boot
    fill_interval: float | None  # the same over the last interval
    padding_efficiency: float | None  # real tokens / computed tokens, since boot
    queued: int | None  # texts waiting in this bucket now; None: stats does not say


@dataclass
class DeviceView:
    """The device telemetry of ``stats["telemetry"]`` (edge/observability/telemetry); None / empty where it says nothing."""

    gpu_load_pct: float | None = None  # the Jetson GPU (devfreq), else the first NVML GPU
    gpu_clock_mhz: float | None = None
    cpu_load_pct: float | None = None  # all CPUs, between two telemetry samples
    temperatures_c: dict = field(default_factory=dict)  # sensor (thermal zone type) -> degrees C
    power_w: dict = field(default_factory=dict)  # rail -> W, the total's rail left out
    power_total_w: float | None = None  # the board's input rail (VDD_IN), else an NVML GPU's draw
    memory_used_bytes: int | None = None  # system memory; on a Jetson shared with the GPU
    memory_total_bytes: int | None = None
    gpu_memory_used_bytes: int | None = None  # a discrete GPU's own memory (NVML)
    gpu_memory_total_bytes: int | None = None
    power_mode: str | None = None  # nvpmodel's name (or id) of the power mode
    pending: str | None = None  # the runtime samples telemetry, but has no sample yet
    present: bool = False  # stats had a telemetry block at all


@dataclass
class View:
    """Everything one frame shows; built by :func:`build_view`, drawn by edge/commands/top_view.py."""

    address: str
    answered: bool = True  # False: the last poll got no reply (the numbers are the last ones seen)
    problem: str | None = None  # why not, for the status line
    state: str | None = None  # booting | ready | draining | stopped
    uptime_s: float | None = None
    lineage: dict = field(default_factory=dict)  # model, engine, device, edge_version; digests shortened
    interval_s: float | None = None  # seconds the rates are over; None on the first poll
    requests: int = 0  # infer requests received since boot
    replies_ok: int = 0
    texts: int = 0  # texts accepted
    errors: int = 0  # error replies, every code
    dropped: int = 0  # replies never sent
    requests_per_s: float | None = None
    texts_per_s: float | None = None
    errors_per_s: float | None = None
    batches_per_s: float | None = None
    latency: dict = field(default_factory=dict)  # HISTOGRAMS name -> Latency since boot
    latency_interval: dict = field(default_factory=dict)  # name -> Latency over the last interval
    queue: dict = field(default_factory=dict)  # stats' queue block as sent
    batches: int = 0
    texts_per_batch: float | None = None  # mean, since boot
    texts_per_batch_interval: float | None = None
    max_batch: int | None = None  # the largest batch cap of any bucket (rows)
    fill: float | None = None  # texts / (batches x their bucket's cap), since boot
    fill_interval: float | None = None
    padding_efficiency: float | None = None  # since boot (stats' batches.padding_efficiency)
    padding_efficiency_interval: float | None = None
    buckets: list = field(default_factory=list)  # BucketRow, by bucket
    connections: dict = field(default_factory=dict)
    device: DeviceView = field(default_factory=DeviceView)


# ------------------------------------------------------------------ pure functions


def quantile(bounds: list, counts: list, q: float, max_: float | None = None) -> float | None:
    """The server's own rule (edge.serving.metrics.bucket_quantile) on counts seen here."""
    from edge.serving.metrics import bucket_quantile

    return bucket_quantile(bounds, counts, q, max_)


def interval_histogram(prev: dict | None, cur: dict | None) -> Latency:
    """Percentiles of what one histogram observed between two snapshots (its count deltas)."""
    if not cur or not prev or prev.get("bounds") != cur.get("bounds"):
        return Latency()
    deltas = [max(0, c - p) for c, p in zip(cur.get("counts") or [], prev.get("counts") or [])]
    bounds = cur.get("bounds") or []
    # The overflow bucket's values are unknown: the run's max bounds them from above.
    p50, p95, p99 = (quantile(bounds, deltas, q, cur.get("max")) for q in QUANTILES)
    return Latency(p50, p95, p99, sum(deltas))


def _get(d, *path, default=None):
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _count(d, *path) -> int:
    """A counter of a stats reply; 0 where it is missing or not a number."""
    return int(_number(_get(d, *path)) or 0)


def _named_numbers(d, key: str | None = None) -> dict:
    """{name: number} from {name: number} or {name: {key: number}}; other entries left out."""
    out = {}
    for name, v in (d.items() if isinstance(d, dict) else ()):
        n = _number(v.get(key) if isinstance(v, dict) else v)
        if n is not None:
            out[str(name)] = n
    return out


def device_view(t) -> DeviceView:
    """Read ``stats["telemetry"]`` (edge/observability/telemetry/sampler.py ``read_all``) defensively: every key
    may be missing, None, or of another shape."""
    if not isinstance(t, dict):
        return DeviceView()
    gpus = t.get("nvml") if isinstance(t.get("nvml"), list) else []
    nvml = gpus[0] if gpus and isinstance(gpus[0], dict) else {}  # a discrete GPU: the first one
    rails = _named_numbers(t.get("power"), "power_w")  # {label: {voltage_mv, current_ma, power_w}}
    total = next((rails.pop(name) for name in TOTAL_RAILS if name in rails), _number(nvml.get("power_w")))
    temps = _named_numbers(t.get("thermal_c"))
    if "gpu" not in temps and _number(nvml.get("temp_c")) is not None:
        temps["gpu"] = _number(nvml.get("temp_c"))
    load, hz = _number(_get(t, "gpu", "load_pct")), _number(_get(t, "gpu", "cur_freq_hz"))
    mode = _get(t, "nvpmodel", "name") or _get(t, "nvpmodel", "id")
    size = {k: None if (n := _number(v)) is None else int(n) for k, v in (
        ("used", _get(t, "memory", "used_bytes")), ("total", _get(t, "memory", "total_bytes")),
        ("gpu_used", nvml.get("memory_used_bytes")), ("gpu_total", nvml.get("memory_total_bytes")))}
    return DeviceView(
        gpu_load_pct=load if load is not None else _number(nvml.get("load_pct")),
        gpu_clock_mhz=hz / 1e6 if hz is not None else _number(nvml.get("clock_mhz")),
        cpu_load_pct=_number(_get(t, "cpu", "load_pct")), temperatures_c=temps, power_w=rails, power_total_w=total,
        memory_used_bytes=size["used"], memory_total_bytes=size["total"], gpu_memory_used_bytes=size["gpu_used"],
        gpu_memory_total_bytes=size["gpu_total"], power_mode=None if mode is None else str(mode),
        pending=t["pending"] if isinstance(t.get("pending"), str) else None, present=True)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _batch_mean(sizes) -> tuple[int, int]:
    """(texts, batches) of stats' batches.sizes {texts per batch (str): batches}."""
    texts = batches = 0
    for k, n in (sizes.items() if isinstance(sizes, dict) else ()):
        try:
            texts += int(k) * int(n)
            batches += int(n)
        except (TypeError, ValueError):
            continue
    return texts, batches


def _comparable(prev: dict | None, cur: dict) -> bool:
    """prev is an earlier snapshot of the same boot: the server did not restart in between."""
    if not prev:
        return False
    up0, up1 = _number(prev.get("uptime_s")), _number(cur.get("uptime_s"))
    if up0 is not None and up1 is not None and up1 < up0:
        return False
    n0, n1 = _number(_get(prev, "requests", "infer")), _number(_get(cur, "requests", "infer"))
    return n0 is None or n1 is None or n1 >= n0  # counters never go down within one boot


def build_view(prev: dict | None, cur: dict, elapsed_s: float | None, address: str) -> View:
    """The frame for ``cur`` (a stats reply); rates and interval figures from ``prev``, the reply
    ``elapsed_s`` seconds before (by the client's clock), when it is of the same boot."""
    same, dt = _comparable(prev, cur), None
    if same and prev is not None:  # same implies prev (_comparable)
        up0, up1 = _number(prev.get("uptime_s")), _number(cur.get("uptime_s"))
        # The server's clock spans exactly the two snapshots; the client's adds its round trips.
        dt = up1 - up0 if up0 is not None and up1 is not None and up1 > up0 else elapsed_s
        same = bool(dt and dt > 0)
    prev, dt = (prev, dt) if same else (None, None)

    def rate(*path) -> float | None:
        return max(0, _count(cur, *path) - _count(prev, *path)) / dt if same and dt else None

    def block(key: str) -> dict:
        return cur[key] if isinstance(cur.get(key), dict) else {}

    lineage = block("lineage")
    short = {k: d[:12] for k in ("bundle_sha256", "package_sha256") if isinstance(d := lineage.get(k), str) and d}
    v = View(address=address, state=cur.get("state"), uptime_s=_number(cur.get("uptime_s")),
             lineage={"model": lineage.get("model"), "engine": lineage.get("engine"), "device": lineage.get("device"),
                      "edge_version": lineage.get("edge_version"), "bundle": short.get("bundle_sha256"),
                      "package": short.get("package_sha256")},
             interval_s=dt, requests=_count(cur, "requests", "infer"), replies_ok=_count(cur, "replies_ok", "infer"),
             texts=_count(cur, "texts_accepted"), errors=_count(cur, "errors_total"),
             dropped=_count(cur, "replies_dropped"), requests_per_s=rate("requests", "infer"),
             texts_per_s=rate("texts_accepted"), errors_per_s=rate("errors_total"),
             batches_per_s=rate("batches", "count"), queue=block("queue"), batches=_count(cur, "batches", "count"),
             padding_efficiency=_number(_get(cur, "batches", "padding_efficiency")),
             connections=block("connections"),
             device=device_view(cur.get("telemetry")) if "telemetry" in cur else DeviceView())
    for name in HISTOGRAMS:
        h = _get(cur, "latency_ms", name)
        v.latency[name] = Latency(p50=_number(h.get("p50")), p95=_number(h.get("p95")), p99=_number(h.get("p99")),
                                  count=_count(h, "count")) if isinstance(h, dict) else Latency()
        v.latency_interval[name] = interval_histogram(_get(prev, "latency_ms", name), h)

    texts, batches = _batch_mean(_get(cur, "batches", "sizes"))
    v.texts_per_batch = _ratio(texts, batches)
    if same:
        t0, b0 = _batch_mean(_get(prev, "batches", "sizes"))
        v.texts_per_batch_interval = _ratio(texts - t0, batches - b0)

    caps = _get(cur, "settings", "batch_caps")
    caps = {str(k): int(c) for k, c in caps.items() if _number(c)} if isinstance(caps, dict) else {}
    v.max_batch = max(caps.values(), default=None)
    by_bucket = _get(cur, "batches", "by_bucket")
    queued = _get(cur, "queue", "by_bucket")  # texts per bucket, if a server ever sends it
    sums = dict.fromkeys(("texts", "slots", "d_texts", "d_slots", "d_tokens", "d_padded"), 0)
    for key in sorted(by_bucket if isinstance(by_bucket, dict) else (), key=lambda k: (len(str(k)), str(k))):
        s, p, cap = by_bucket[key], _get(prev, "batches", "by_bucket", key), caps.get(str(key))
        n, t = _count(s, "batches"), _count(s, "texts")
        dn, dtexts = n - _count(p, "batches"), t - _count(p, "texts")
        if cap:
            sums["texts"], sums["slots"] = sums["texts"] + t, sums["slots"] + n * cap
            sums["d_texts"], sums["d_slots"] = sums["d_texts"] + dtexts, sums["d_slots"] + dn * cap
        sums["d_tokens"] += _count(s, "tokens") - _count(p, "tokens")
        sums["d_padded"] += _count(s, "padded_tokens") - _count(p, "padded_tokens")
        q = _get(queued, str(key))
        v.buckets.append(BucketRow(
            bucket=int(key) if str(key).isdigit() else key, cap=cap, batches=n, texts=t,
            fill=_ratio(t, n * cap) if cap else None, fill_interval=_ratio(dtexts, dn * cap) if cap and same else None,
            padding_efficiency=_ratio(_count(s, "tokens"), _count(s, "padded_tokens")),
            queued=_count(q, "texts") if isinstance(q, dict) else None if _number(q) is None else int(q)))
    v.fill = _ratio(sums["texts"], sums["slots"])
    if same:
        v.fill_interval = _ratio(sums["d_texts"], sums["d_slots"])
        v.padding_efficiency_interval = _ratio(sums["d_tokens"], sums["d_padded"])
    return v


def no_answer_view(address: str, last: View | None, why: str) -> View:
    """The frame while the server does not answer: the last numbers seen (no rates), and why."""
    if last is None:
        return View(address=address, answered=False, problem=why)
    return replace(last, answered=False, problem=why, interval_s=None, requests_per_s=None, texts_per_s=None,
                   errors_per_s=None, batches_per_s=None)


# ------------------------------------------------------------------ command line
