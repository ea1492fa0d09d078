"""Loading maps the weights: anonymous memory grows by < 10 % of the weight bytes.

Measured in a fresh process (tests/engines/rss_probe.py) after the engine's library is
loaded (``import torch``; ONNX Runtime's C library and its process-wide OrtEnv), with each
engine's default settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("rss_probe.py")
REPO = Path(__file__).resolve().parents[2]


def probe(package: Path, engine: str, options: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, str(PROBE), str(package), engine, json.dumps(options or {})],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("engine", ["onnxruntime", "torchscript"])
def test_load_does_not_copy_weights(minilm_package, engine):
    r = probe(minilm_package, engine)
    assert r["weight_bytes"] > 80 * 2**20  # the mapped file: model.ort / weights.safetensors
    assert r["delta_load"] < 0.10 * r["weight_bytes"], (
        f"{engine}: RssAnon grew {r['delta_load'] / 2**20:.1f} MiB on load, "
        f"limit {0.1 * r['weight_bytes'] / 2**20:.1f} MiB"
    )
    assert abs(r["norm"] - 1.0) < 1e-5  # and the mapped model computes


def test_ort_prepacking_copies(minilm_package):
    """The control: with MLAS pre-packing on, ORT copies the MatMul weights (why it is off)."""
    on = probe(minilm_package, "onnxruntime", {"prepacking": True})
    assert on["delta_load"] > 0.25 * on["weight_bytes"]
