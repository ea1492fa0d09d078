"""Fault injection on the primary engine, off by default: a delay added to every batch, and a
share of batches that fail, so tests and technicians can trip the circuit breaker on purpose
(``--fault-engine-delay-ms``, ``--fault-engine-error-rate``; docs/breaker.md).

It wraps the engine the boot loaded; the wrapped engine's ``run`` is the same call on the same
buffers, so everything but the injected fault is the real path. The runtime logs a warning at
boot while a fault is set: it must never be left on by mistake unnoticed.
"""

from __future__ import annotations

import random
import time
from typing import Any

__all__ = ["FaultyEngine", "InjectedFault", "with_faults"]


class InjectedFault(RuntimeError):
    """The failure ``--fault-engine-error-rate`` asked for."""


class FaultyEngine:
    """``engine`` with ``delay_ms`` before every run and a failure in ``error_rate`` of them."""

    def __init__(self, engine: Any, *, delay_ms: float = 0.0, error_rate: float = 0.0, seed: int | None = None) -> None:
        if delay_ms < 0 or not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"fault injection: delay {delay_ms} ms must be >= 0, error rate {error_rate} in [0, 1]")
        self._engine = engine
        self.delay_ms = delay_ms
        self.error_rate = error_rate
        self._random = random.Random(seed)
        self.injected = {"delayed": 0, "failed": 0}

    @property
    def unfaulted(self) -> Any:
        """The engine without the faults: what the breaker's yardstick is measured on (the deferred
        warm-up, edge/serving/engine_loop.py), as boot's warm-up measured it before the wrapping."""
        return self._engine

    def __getattr__(self, name: str) -> Any:  # name, device, providers, ...: the real engine's
        return getattr(self._engine, name)

    def run(self, ids, mask):
        if self.delay_ms:
            self.injected["delayed"] += 1
            time.sleep(self.delay_ms / 1000.0)
        if self.error_rate and self._random.random() < self.error_rate:
            self.injected["failed"] += 1
            raise InjectedFault(f"injected engine failure (--fault-engine-error-rate {self.error_rate:g})")
        return self._engine.run(ids, mask)


def with_faults(engine: Any, delay_ms: float | None, error_rate: float | None) -> Any:
    """``engine``, wrapped when a fault is set."""
    if not delay_ms and not error_rate:
        return engine
    return FaultyEngine(engine, delay_ms=delay_ms or 0.0, error_rate=error_rate or 0.0)
