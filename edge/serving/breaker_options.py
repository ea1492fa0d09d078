"""``edge serve``'s flags for the circuit breaker, its fallback and fault injection
(docs/breaker.md), added to the serve parser by :func:`edge.runtime.serve_args.serve_parser`; the
``EDGE_*`` variables they read are in :data:`edge.config.env.ENVIRONMENT`.

Imported at boot by the serve parser: standard library only.
"""

from __future__ import annotations

from edge.config.argtypes import number

__all__ = ["DEFAULT_THRESHOLD", "DEFAULT_COOLDOWN_S", "DEFAULT_PROBES", "add_serve_arguments"]

DEFAULT_THRESHOLD = 5  # consecutive requests that miss their deadline or fail in the engine: the source design's
DEFAULT_COOLDOWN_S = 30.0  # open this long before a probe goes to the primary (s)
DEFAULT_PROBES = 3  # consecutive probe requests served in time to close again



def _bounded(kind, low: float, high: float, env_name: str, what: str):
    return number(kind, what, ok=lambda v: low <= v <= high, rule=f"{what} from {low:g} to {high:g}", env_name=env_name)


def add_serve_arguments(p, e) -> None:
    """The breaker's flags on ``edge serve``'s parser ``p``; ``e(name, default)`` reads a variable."""
    p.add_argument("--breaker-threshold", metavar="N", default=e("EDGE_BREAKER_THRESHOLD", str(DEFAULT_THRESHOLD)),
                   type=_bounded(int, 1, 10_000, "EDGE_BREAKER_THRESHOLD", "a whole number of requests"),
                   help="consecutive requests that miss their deadline or fail in the engine before the circuit "
                        "breaker trips: then the fallback serves them (replies say degraded), or they fail at once "
                        f"with BREAKER_OPEN (default {DEFAULT_THRESHOLD}; docs/breaker.md; env EDGE_BREAKER_THRESHOLD)")
    p.add_argument("--breaker-cooldown", metavar="SECONDS",
                   default=e("EDGE_BREAKER_COOLDOWN_S", str(DEFAULT_COOLDOWN_S)),
                   type=_bounded(float, 0, 86_400, "EDGE_BREAKER_COOLDOWN_S", "seconds"),
                   help="seconds the breaker stays open before it probes the primary engine again "
                        f"(default {DEFAULT_COOLDOWN_S:g}; env EDGE_BREAKER_COOLDOWN_S)")
    p.add_argument("--breaker-probes", metavar="N", default=e("EDGE_BREAKER_PROBES", str(DEFAULT_PROBES)),
                   type=_bounded(int, 1, 10_000, "EDGE_BREAKER_PROBES", "a whole number of requests"),
                   help="consecutive probe requests the primary must serve in time for the breaker to close "
                        f"(default {DEFAULT_PROBES}; env EDGE_BREAKER_PROBES)")
    p.add_argument("--fallback", choices=("auto", "off"), default=e("EDGE_FALLBACK", "auto"),
                   help="auto: load and warm the fallback the package declares (edge-package build "
                        "--fallback-package / --fallback-device) at boot; off: none (env EDGE_FALLBACK)")
    p.add_argument("--fault-engine-delay-ms", metavar="MS", default=e("EDGE_FAULT_ENGINE_DELAY_MS", "0"),
                   type=_bounded(float, 0, 600_000, "EDGE_FAULT_ENGINE_DELAY_MS", "milliseconds"),
                   help="TESTING ONLY: add this delay to every run of the primary engine, to trip the breaker on "
                        "purpose; logged as a warning at boot (default 0: off; env EDGE_FAULT_ENGINE_DELAY_MS)")
    p.add_argument("--fault-engine-error-rate", metavar="RATE", default=e("EDGE_FAULT_ENGINE_ERROR_RATE", "0"),
                   type=_bounded(float, 0, 1, "EDGE_FAULT_ENGINE_ERROR_RATE", "a share"),
                   help="TESTING ONLY: fail this share (0-1) of the primary engine's runs (default 0: off; "
                        "env EDGE_FAULT_ENGINE_ERROR_RATE)")
