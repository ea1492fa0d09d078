"""The environment of a child python that imports ``support`` as the tests do: a script of
tests/support run as a process (``python -m support.serve_fake``), a ``python -c`` driver.

pytest puts tests/ on its own sys.path (tests/conftest.py's directory, no ``__init__.py`` above
it); a child gets it from PYTHONPATH instead, after the entries already there, so that a checkout
named there still comes first for ``edge``, ``image`` and ``bench``. Nothing else in the tests
changes sys.path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with tests/ at the end of PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(TESTS) not in parts:
        parts.append(str(TESTS))
    out["PYTHONPATH"] = os.pathsep.join(parts)
    return out
