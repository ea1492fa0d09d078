"""The L4T release of a Jetson, from ``/etc/nv_tegra_release``, read one way by everyone who
reads it: the installer's compatibility check (edge/update/install/compat.py), ``edge doctor`` and the
telemetry (edge/observability/telemetry/system.py). Standard library only.

    # R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, ...  ->  "36.3.0"
"""

from __future__ import annotations

import re

__all__ = ["L4T_RELEASE", "l4t_release", "l4t_in_range"]

L4T_RELEASE = re.compile(r"R(\d+)\s*\([^)]*\),\s*REVISION:\s*([\d.]+)")


def l4t_release(text: str) -> str | None:
    """``"36.3.0"`` from the file's text; None when it has no release line."""
    m = L4T_RELEASE.search(text)
    return f"{m.group(1)}.{m.group(2).rstrip('.')}" if m else None


def _version(text: str) -> tuple[int, ...]:  # "36.3.0" -> (36, 3, 0)
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def l4t_in_range(version: str, low: str | None, high: str | None) -> bool:
    """``high`` covers its sub-releases: 36.3.0 is within 36.0-36.3. None: unbounded."""
    v = _version(version)
    return ((low is None or v[:len(_version(low))] >= _version(low))
            and (high is None or v[:len(_version(high))] <= _version(high)))
