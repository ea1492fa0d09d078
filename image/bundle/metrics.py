"""Metrics in a bundle: is ``prometheus_client`` in the runtime's environment, and the textfile directory.

The runtime imports ``prometheus_client`` only after READY (``edge/observability/metrics/publish.py``), so a
plain traced boot never sees it nor the standard library it imports (``http.server``, ``wsgiref``,
``ssl``, ``email``...). When the environment has it, the trace boots with ``--metrics-textfile``
(:func:`trace_args`): the publisher starts after READY and writes, and those files are traced;
the rootfs also gets the ``prometheus_client`` package wholesale (``rootfs.select_files``).

``edge-bundle build --metrics-dir HOSTDIR`` bind-mounts HOSTDIR on :data:`CONTAINER_METRICS_DIR`
(``oci_config.add_metrics_dir``) and points ``EDGE_METRICS_TEXTFILE`` there; edge-supervise creates
HOSTDIR (the runtime's user, 0755: node_exporter's textfile collector reads it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

__all__ = ["PACKAGE", "prometheus_client_version", "trace_args", "metadata"]

PACKAGE = "prometheus_client"
_PROBE = ("import importlib.util as u, importlib.metadata as m, json\n"
          f"s = u.find_spec({PACKAGE!r})\n"
          f"print(json.dumps(s and m.version({PACKAGE!r})))\n")


def prometheus_client_version(python: str, env: dict[str, str]) -> str | None:
    """``prometheus_client``'s version as the runtime imports it (``python -S``, ``env``'s PYTHONPATH),
    or None when that environment does not have it."""
    run = subprocess.run([python, "-S", "-c", _PROBE], env={"PYTHONPATH": env.get("PYTHONPATH", "")},
                         capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        return None
    try:
        return json.loads(run.stdout.strip().splitlines()[-1]) or None
    except (ValueError, IndexError):
        return None


def trace_args(workdir: Path, version: str | None) -> list[str]:
    """Boot arguments of the trace: a textfile in ``workdir`` when ``prometheus_client`` is there."""
    if version is None:
        return []
    d = Path(workdir) / "metrics"
    d.mkdir(parents=True, exist_ok=True)
    return ["--metrics-textfile", str(d)]


def metadata(version: str | None, metrics_dir: str | None) -> dict:
    """The ``metrics`` and ``metrics_dir`` keys of ``edge-bundle.json``."""
    return {"metrics": {PACKAGE: version} if version else None, "metrics_dir": metrics_dir}
