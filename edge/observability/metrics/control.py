"""Metric families of the control plane: the request journal (docs/trace.md) and the circuit
breaker (docs/breaker.md); :class:`edge.observability.metrics.export.EdgeCollector` yields them with the rest.
Imported with edge.observability.metrics.export only (prometheus_client), after READY."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["journal_families", "breaker_families"]

BREAKER_STATES = ("closed", "open", "half_open")  # edge.serving.breaker.BreakerState's values


def journal_families(info: dict | None) -> Iterator[Metric]:
    """The request journal (docs/trace.md): ``info`` is :meth:`edge.observability.journal.writer.Journal.info`,
    None when the runtime keeps no journal (every family is still there, at 0)."""
    info = info or {}
    rej = info.get("rejected") or {}
    g = GaugeMetricFamily("edge_journal_enabled", "1 while the request journal writes entries (0: off, or turned off "
                          "by a write error)")
    g.add_metric([], 1 if info.get("enabled") else 0)
    yield g
    c = CounterMetricFamily("edge_journal_entries_written_total", "Journal entries written (one per reply)")
    c.add_metric([], info.get("entries_written", 0))
    yield c
    c = CounterMetricFamily("edge_journal_entries_dropped_total", "Journal entries not written: queue_full (the "
                            "writer fell behind), disabled (after a write error), too_large, no_space (lost while "
                            "writing was paused by a full disk)", labels=["reason"])
    for reason in ("queue_full", "disabled", "too_large", "no_space"):
        c.add_metric([reason], (info.get("dropped_by_reason") or {}).get(reason, 0))
    yield c
    c = CounterMetricFamily("edge_journal_write_errors_total", "Failed journal or rejected-sample writes")
    c.add_metric([], info.get("write_errors", 0))
    yield c
    for name, doc, value in (("edge_journal_bytes", "Bytes of the journal's segment files (never above the cap)",
                              info.get("bytes", 0)),
                             ("edge_journal_max_bytes", "The journal's cap (--journal-max-bytes)",
                              info.get("max_bytes", 0)),
                             ("edge_journal_segments", "Segment files of the journal", info.get("segments", 0)),
                             ("edge_rejected_samples", "Rejected requests' payloads kept (--keep-rejected)",
                              rej.get("kept", 0))):
        g = GaugeMetricFamily(name, doc)
        g.add_metric([], value)
        yield g
    c = CounterMetricFamily("edge_rejected_samples_written_total", "Rejected requests' payloads written")
    c.add_metric([], rej.get("written", 0))
    yield c


def breaker_families(snap: dict | None) -> Iterator[Metric]:
    """The circuit breaker: ``snap`` is :meth:`edge.serving.breaker.CircuitBreaker.snapshot` (None:
    every family at 0, closed)."""
    snap = snap or {"state": "closed"}
    g = GaugeMetricFamily("edge_breaker_state", "1 for the circuit breaker's current state", labels=["state"])
    for state in BREAKER_STATES:
        g.add_metric([state], 1 if snap.get("state") == state else 0)
    yield g
    g = GaugeMetricFamily("edge_breaker_consecutive_misses", "Requests in a row the primary engine missed (deadline "
                          "or failure) while closed; the breaker trips at --breaker-threshold")
    g.add_metric([], snap.get("consecutive_misses", 0))
    yield g
    g = GaugeMetricFamily("edge_breaker_fallback", "1 when a fallback is loaded and serves while the breaker is open")
    g.add_metric([], 1 if snap.get("has_fallback") else 0)
    yield g
    for name, doc, key in (("edge_breaker_trips_total", "Times the circuit breaker tripped (opened)", "trips"),
                           ("edge_breaker_closes_total", "Times it closed again after its probes", "closes"),
                           ("edge_degraded_requests_total", "Requests the fallback served (replies said degraded)",
                            "degraded_requests"),
                           ("edge_breaker_failed_fast_requests_total", "Requests answered BREAKER_OPEN (open, no "
                            "fallback)", "failed_fast_requests")):
        c = CounterMetricFamily(name, doc)
        c.add_metric([], snap.get(key, 0))
        yield c
