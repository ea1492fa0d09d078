"""Draw an ``edge top`` frame: :func:`render` turns a :class:`edge.commands.top.View` into rich renderables.

No I/O and no clock: the same View always draws the same text, so tests render into a
``Console(record=True)`` and read it back. Absent values are drawn as "—" (docs/top.md).
"""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from edge.commands.top_model import HISTOGRAMS, View

__all__ = ["render", "ABSENT"]

ABSENT = "—"


def _num(v, fmt: str = "{:.1f}") -> str:
    return ABSENT if v is None else fmt.format(v)


def _ms(v) -> str:
    """A histogram bound (ms): 0.25, 2, 1000."""
    return ABSENT if v is None else f"{v:g}"


def _pct(v) -> str:
    return ABSENT if v is None else f"{v * 100:.0f}%"


def _of(n, cap) -> str:
    return f"{ABSENT if n is None else n}/{ABSENT if cap is None else cap}"


def _bytes(n) -> str:
    if n is None:
        return ABSENT
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _uptime(s) -> str:
    if s is None:
        return ABSENT
    s = int(s)
    days, rest = divmod(s, 86400)
    text = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {text}" if days else text


def _table(*columns: str) -> Table:
    t = Table(*columns, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for i, c in enumerate(t.columns):
        c.no_wrap = True
        c.justify = "right" if i else "left"
    return t


def _section(title: str, table: Table) -> Group:
    return Group(Text(title, style="bold"), table)


def _header(v: View) -> Group:
    state = v.state or ABSENT
    style = "green" if v.state == "ready" and v.answered else "yellow" if v.answered else "red"
    line = Text.assemble(("edge top ", "bold"), v.address, "  ", (state, style), f"  up {_uptime(v.uptime_s)}")
    if v.interval_s is not None:
        line.append(f"  last {v.interval_s:.1f} s")
    lin = v.lineage
    who = Text(f"model {lin.get('model') or ABSENT}  engine {lin.get('engine') or ABSENT}  device "
               f"{lin.get('device') or ABSENT}  bundle {lin.get('bundle') or ABSENT}  package "
               f"{lin.get('package') or ABSENT}  edge {lin.get('edge_version') or ABSENT}", style="dim")
    parts = [line, who]
    if not v.answered:
        parts.append(Text(v.problem or f"no answer from {v.address} (retrying)", style="bold red"))
    return Group(*parts)


def _traffic(v: View) -> Group:
    t = _table("", "since boot", "per s")
    t.add_row("infer requests", str(v.requests), _num(v.requests_per_s))
    t.add_row("texts", str(v.texts), _num(v.texts_per_s))
    t.add_row("batches", str(v.batches), _num(v.batches_per_s))
    t.add_row("errors", str(v.errors), _num(v.errors_per_s))
    t.add_row("replies dropped", str(v.dropped), "")
    return _section("traffic", t)


def _latency(v: View) -> Group:
    t = _table("ms", "p50", "p95", "p99", "n", "last p50", "p95", "p99", "n")
    for name in HISTOGRAMS:
        run, last = v.latency.get(name), v.latency_interval.get(name)
        cells = []
        for h in (run, last):
            cells += [_ms(h.p50), _ms(h.p95), _ms(h.p99), str(h.count)] if h else [ABSENT] * 4
        if v.interval_s is None:
            cells[4:] = [ABSENT] * 4
        t.add_row(name, *cells)
    return _section("latency ms (bucket bounds): since boot | last", t)


def _queue_and_batches(v: View) -> Group:
    q, last = v.queue, v.interval_s is not None
    t = _table("", "now/boot", "last")
    t.add_row("queued texts", _of(q.get("texts"), q.get("max_texts")), "")
    t.add_row("queued tokens", _of(q.get("tokens"), q.get("max_queued_tokens")), "")
    t.add_row("in flight", _num(q.get("in_flight"), "{}"), "")
    t.add_row("pending bytes", f"{_bytes(q.get('pending_text_bytes'))}/{_bytes(q.get('max_pending_text_bytes'))}",
              "")
    t.add_row("texts/batch", f"{_num(v.texts_per_batch)} of {_num(v.max_batch, '{}')}",
              _num(v.texts_per_batch_interval if last else None))
    t.add_row("batch fill", _pct(v.fill), _pct(v.fill_interval if last else None))
    t.add_row("padding eff", _pct(v.padding_efficiency), _pct(v.padding_efficiency_interval if last else None))
    c = v.connections
    if c:
        t.add_row("connections", _of(c.get("open"), c.get("cap")), "")
    return _section("queue and batches", t)


def _buckets(v: View) -> Group:
    t = _table("bucket", "queued", "cap", "batches", "texts", "fill", "last", "pad eff")
    for b in v.buckets:
        t.add_row(str(b.bucket), _num(b.queued, "{}"), _num(b.cap, "{}"), str(b.batches), str(b.texts), _pct(b.fill),
                  _pct(b.fill_interval if v.interval_s is not None else None), _pct(b.padding_efficiency))
    return _section("buckets (tokens per row; cap: rows per batch)", t)


def _device(v: View) -> Group:
    d = v.device
    t = Table.grid(padding=(0, 2))
    t.add_column(no_wrap=True)
    t.add_column()
    clock = f" at {d.gpu_clock_mhz:.0f} MHz" if d.gpu_clock_mhz is not None else ""
    t.add_row("GPU load", _num(d.gpu_load_pct, "{:.0f}%") + clock)
    t.add_row("CPU load", _num(d.cpu_load_pct, "{:.0f}%"))
    t.add_row("memory", f"{_bytes(d.memory_used_bytes)} / {_bytes(d.memory_total_bytes)}")
    if d.gpu_memory_used_bytes is not None or d.gpu_memory_total_bytes is not None:  # a discrete GPU's own
        t.add_row("GPU memory", f"{_bytes(d.gpu_memory_used_bytes)} / {_bytes(d.gpu_memory_total_bytes)}")
    rails = "  ".join(f"{k} {w:.2f} W" for k, w in d.power_w.items())
    mode = f"  mode {d.power_mode}" if d.power_mode else ""
    t.add_row("power", _num(d.power_total_w, "{:.2f} W") + (f"  ({rails})" if rails else "") + mode)
    temps = "  ".join(f"{k} {c:.1f} °C" for k, c in d.temperatures_c.items())
    t.add_row("temperatures", temps or ABSENT)
    title = "device" if d.present and not d.pending else f"device ({d.pending})" if d.present else \
        "device (stats carry no telemetry)"
    return _section(title, t)


class _Flow:
    """Sections side by side while they fit the console's width, else on the next row: a frame
    fits 24 lines of a wide terminal and still reads on 80 columns."""

    def __init__(self, *sections, gap: int = 4) -> None:
        self.sections, self.gap = sections, gap

    def __rich_console__(self, console, options):
        rows, used = [[]], 0
        for section in self.sections:
            width = Measurement.get(console, options, section).maximum
            if rows[-1] and used + self.gap + width > options.max_width:
                rows.append([])
            used = width if not rows[-1] else used + self.gap + width
            rows[-1].append(section)
        for i, row in enumerate(rows):
            grid = Table.grid(padding=(0, self.gap), pad_edge=False)
            grid.add_row(*row)
            if i:
                yield Text("")
            yield grid


def render(v: View) -> Group:
    """The whole frame: the header, then the sections, as many side by side as the width holds."""
    return Group(_header(v), Text(""), _Flow(_traffic(v), _queue_and_batches(v), _latency(v), _device(v), _buckets(v)))
