"""What ``edge doctor`` found: one :class:`Check` per check, the :class:`Report`, and its two
renderings (a table for a person, one JSON document for a script)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

__all__ = ["Verdict", "Check", "Report", "render_table", "render_json"]


class Verdict(str, enum.Enum):
    PASS = "PASS"  # checked, and as it should be
    WARN = "WARN"  # works, but something is off or optional is missing; the fix says what to do
    FAIL = "FAIL"  # the service cannot work (or cannot work well) like this; the fix says what to do
    NA = "N/A"  # does not apply here (a Jetson check on another machine, a service that is down)


@dataclass
class Check:
    """One check's outcome. ``fix`` is one line, set for WARN and FAIL (None otherwise)."""

    name: str  # one of edge.commands.doctor.CHECKS
    verdict: Verdict
    detail: str  # one sentence: what was seen
    fix: str | None = None  # one line: what to do about it
    measured: dict = field(default_factory=dict)  # the values read (paths, versions, bytes, ms)

    def as_dict(self) -> dict:
        return {"name": self.name, "verdict": self.verdict.value, "detail": self.detail, "fix": self.fix,
                "measured": self.measured}


@dataclass
class Report:
    checks: list[Check]
    root: str
    bundle: str | None  # the bundle directory read (None: none there)
    address: str | None  # the server's address (None: not the running system, nothing to ask)
    address_source: str
    unit: str
    elapsed_ms: float = 0.0

    def named(self, verdict: Verdict) -> list[str]:
        return [c.name for c in self.checks if c.verdict is verdict]

    @property
    def verdict(self) -> Verdict:
        """FAIL when any check failed, else WARN when any warned, else PASS."""
        for v in (Verdict.FAIL, Verdict.WARN):
            if self.named(v):
                return v
        return Verdict.PASS

    @property
    def exit_status(self) -> int:
        return 1 if self.named(Verdict.FAIL) else 0

    def summary(self) -> dict:
        return {"verdict": self.verdict.value, "exit_status": self.exit_status,
                "counts": {v.value: len(self.named(v)) for v in Verdict},
                "failed": self.named(Verdict.FAIL), "warned": self.named(Verdict.WARN),
                "not_applicable": self.named(Verdict.NA), "elapsed_ms": round(self.elapsed_ms, 1)}

    def as_dict(self) -> dict:
        from edge import __version__

        return {"summary": self.summary(), "root": self.root, "bundle": self.bundle, "address": self.address,
                "address_source": self.address_source, "unit": self.unit, "edge_version": __version__,
                "checks": [c.as_dict() for c in self.checks]}


def _summary_line(report: Report) -> str:
    counts = report.summary()["counts"]
    parts = ", ".join(f"{counts[v.value]} {v.value}" for v in Verdict if counts[v.value])
    failed = report.named(Verdict.FAIL)
    head = f"FAIL ({', '.join(failed)})" if failed else report.verdict.value
    return f"edge doctor: {head}; {parts}; {report.elapsed_ms / 1000:.1f} s"


def render_table(report: Report) -> str:
    """CHECK, VERDICT, DETAIL columns; a WARN's or FAIL's fix on the line below its detail."""
    width = max([len("CHECK")] + [len(c.name) for c in report.checks])
    pad = " " * (width + 2 + 7 + 2)
    lines = [f"{'CHECK':<{width}}  {'VERDICT':<7}  DETAIL"]
    for c in report.checks:
        lines.append(f"{c.name:<{width}}  {c.verdict.value:<7}  {c.detail}")
        if c.fix:
            lines.append(f"{pad}fix: {c.fix}")
    lines.append(_summary_line(report))
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    return json.dumps(report.as_dict(), indent=2, sort_keys=True, default=str) + "\n"
