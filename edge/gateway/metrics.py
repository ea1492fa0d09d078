"""The gateway's own Prometheus metrics (``GET /metrics``), beside the runtime's.

Written in the text exposition format by hand: a handful of counters and one histogram do not
need prometheus-client's import on the device. Every name starts with ``edge_gateway_``, so
both scrapes can go to one Prometheus without clashing with the runtime's ``edge_*``.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter

__all__ = ["GatewayMetrics"]

BOUNDS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # (s)


class GatewayMetrics:
    """Owned by the event loop's thread: no lock."""

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: Counter = Counter()  # (route, status) -> responses
        self.errors: Counter = Counter()  # runtime or gateway error code name -> count
        self.texts = 0
        self.refused_connections = 0
        self.closed_idle = 0
        self.buckets = [0] * (len(BOUNDS_S) + 1)
        self.sum_s = 0.0
        self.count = 0

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] += 1
        self.buckets[bisect.bisect_left(BOUNDS_S, seconds)] += 1
        self.sum_s += seconds
        self.count += 1

    def render(self, open_connections: int, in_flight: int) -> str:
        out = ["# HELP edge_gateway_requests_total HTTP responses, by route and status.",
               "# TYPE edge_gateway_requests_total counter"]
        for (route, status), n in sorted(self.requests.items()):
            out.append(f'edge_gateway_requests_total{{route="{route}",status="{status}"}} {n}')
        out += ["# HELP edge_gateway_errors_total Error responses, by code name.",
                "# TYPE edge_gateway_errors_total counter"]
        for name, n in sorted(self.errors.items()):
            out.append(f'edge_gateway_errors_total{{code="{name}"}} {n}')
        out += ["# HELP edge_gateway_texts_total Texts embedded.", "# TYPE edge_gateway_texts_total counter",
                f"edge_gateway_texts_total {self.texts}",
                "# HELP edge_gateway_connections_refused_total Connections refused over --max-connections.",
                "# TYPE edge_gateway_connections_refused_total counter",
                f"edge_gateway_connections_refused_total {self.refused_connections}",
                "# HELP edge_gateway_connections_closed_idle_total Connections closed after --idle-timeout.",
                "# TYPE edge_gateway_connections_closed_idle_total counter",
                f"edge_gateway_connections_closed_idle_total {self.closed_idle}",
                "# HELP edge_gateway_connections_open HTTP connections held now.",
                "# TYPE edge_gateway_connections_open gauge", f"edge_gateway_connections_open {open_connections}",
                "# HELP edge_gateway_upstream_in_flight Runtime requests awaiting their reply.",
                "# TYPE edge_gateway_upstream_in_flight gauge", f"edge_gateway_upstream_in_flight {in_flight}",
                "# HELP edge_gateway_request_duration_seconds Arrival to response, per HTTP request.",
                "# TYPE edge_gateway_request_duration_seconds histogram"]
        acc = 0
        for bound, n in zip((*BOUNDS_S, float("inf")), self.buckets):
            acc += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'edge_gateway_request_duration_seconds_bucket{{le="{le}"}} {acc}')
        out += [f"edge_gateway_request_duration_seconds_sum {self.sum_s:.6f}",
                f"edge_gateway_request_duration_seconds_count {self.count}",
                "# TYPE edge_gateway_start_time_seconds gauge", f"edge_gateway_start_time_seconds {self.started:.3f}"]
        return "\n".join(out) + "\n"
