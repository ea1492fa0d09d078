"""The circuit breaker in a real runtime process, over its real socket (docs/breaker.md).

With the int8 fallback the package names and an injected engine delay longer than the requests'
deadline, the breaker trips after exactly ``--breaker-threshold`` missed requests, the fallback
then serves (``degraded: true``, the int8 package's lineage, in the journal too) with embeddings
within cos 0.99 of the primary's on the parity texts, and after the cool-down it closes again
once the primary serves the server's own probes in time. Without a fallback, engine failures trip it and
requests fail fast with BREAKER_OPEN.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edge.errors import EdgeError, ErrorCode
from edge.ipc.client import EdgeClient

from support.runtime_proc import start_runtime

THRESHOLD = 5
# A late request counts against the primary only when its deadline was possible (budget >= the
# shape's warm-up time) and the engine was slow (> 3 x that + 10 ms; docs/breaker.md). On a CPU the
# warm-up time is one first run per bucket: 60-80 ms for 1x256 on an idle AVX2-only host, and more
# beside a full suite. With 400 and 150 ms, one miss in a full run went uncounted there. Now a
# warm-up time would have to pass 330 ms to hide a miss, and the delay stays well inside the probe's
# 2 s deadline (edge.serving.breaker.PROBE_DEADLINE_S), so a probe with the delay still on passes.
DELAY_MS = 1000  # the primary's injected delay: longer than TIGHT_MS, far shorter than LOOSE_MS
TIGHT_MS = 400
LOOSE_MS = 10_000
COOLDOWN_S = 8.0  # long enough for the parity texts to go through the fallback while it is open
PARITY_MIN_COSINE = 0.99


def _breaker(client: EdgeClient) -> dict:
    return client.stats()["breaker"]


def _primary_embeddings(package: Path, texts: list[str]) -> np.ndarray:
    """The primary's embeddings, in this process with the runtime's own engine (its run in the
    server is slowed on purpose)."""
    from edge.preload.manifest import open_package
    from image.quantize import embed_texts

    pkg = open_package(package, verify="none", engine="onnxruntime")
    return embed_texts(pkg, texts, pkg.path(pkg.manifest.tokenizer))


def test_breaker_trips_degrades_to_the_int8_fallback_and_recovers(minilm_fallback_package, tmp_path, capsys):
    from edge.preload.manifest import open_package
    from image.quantize import parity_texts

    state = tmp_path / "state"
    rt = start_runtime(tmp_path, "--package", str(minilm_fallback_package), "--engine", "onnxruntime",
                       "--device", "cpu", "--state-dir", str(state), "--fault-engine-delay-ms", str(DELAY_MS),
                       "--breaker-threshold", str(THRESHOLD), "--breaker-cooldown", str(COOLDOWN_S),
                       "--breaker-probes", "2")
    texts = parity_texts()
    primary = _primary_embeddings(minilm_fallback_package, texts)
    fallback_sha = open_package(minilm_fallback_package / "fallback", verify="none").manifest.package_sha256
    try:
        rt.wait_ready()
        assert "boot.fault_injection" in rt.output()  # never on unnoticed
        with EdgeClient(rt.address, timeout_s=60) as client:
            stages = {s["stage"] for s in client.stats()["timeline"]["stages"]}
            assert {"load_fallback", "warm_fallback"} <= stages, stages  # its cost shows in the timeline
            snap = _breaker(client)
            assert snap["state"] == "closed" and snap["has_fallback"] and snap["fallback"]["package_sha256"] == fallback_sha
            # 1. Misses: the primary takes DELAY_MS, each request gives it TIGHT_MS.
            for i in range(THRESHOLD):
                with pytest.raises(EdgeError) as err:
                    client.embed([texts[i]], deadline_ms=TIGHT_MS)
                assert err.value.code == ErrorCode.DEADLINE_EXCEEDED, err.value
                snap = _breaker(client)
                if i < THRESHOLD - 1:
                    assert snap["state"] == "closed" and snap["consecutive_misses"] == i + 1, (i, snap)
            assert snap["state"] == "open" and snap["trips"] == 1 and snap["last_trip"]["after_misses"] == THRESHOLD
            # 2. Open: the fallback serves, whatever the deadline; replies say so and name it.
            t0 = time.monotonic()
            got, degraded_trace = [], None
            for s in range(0, len(texts), 32):
                r = client.embed(texts[s:s + 32], deadline_ms=LOOSE_MS)
                assert r.meta["degraded"] is True and r.meta["package_sha256"] == fallback_sha, r.meta
                got.append(np.asarray(r.embeddings))
                degraded_trace = r.meta["trace_id"]
            assert time.monotonic() - t0 < COOLDOWN_S, "the parity texts outlasted the cool-down"
            fb = np.concatenate(got)
            cos = np.sum(fb * primary, axis=1) / (np.linalg.norm(fb, axis=1) * np.linalg.norm(primary, axis=1))
            assert cos.min() >= PARITY_MIN_COSINE, (cos.min(), texts[int(cos.argmin())])
            snap = _breaker(client)
            assert snap["state"] == "open" and snap["degraded_requests"] == (len(texts) + 31) // 32
            # 3. Recovery: after the cool-down the server probes the primary with its own input and
            # deadline (never a client's request); served in time, it closes, with the delay still on.
            snap = _wait_closed(client, deadline_s=COOLDOWN_S + 60)
            assert snap["closes"] == 1 and snap["trips"] == 1 and snap["probes_run"]["passed"] == 2, snap
            for _ in range(2):
                r = client.embed(["is the primary back?"], deadline_ms=LOOSE_MS)
                assert r.meta["degraded"] is False and r.meta["package_sha256"] != fallback_sha, r.meta
            snap = _breaker(client)
            assert snap["state"] == "closed" and snap["closes"] == 1 and snap["trips"] == 1, snap
        # The journal names what served the degraded reply.
        entry = _trace(degraded_trace, state)
        assert entry.get("degraded") is True and fallback_sha in json.dumps(entry), entry
    finally:
        rt.stop()
    with capsys.disabled():
        print(f"\n[breaker] int8 fallback vs primary on {len(texts)} parity texts, served through the runtime: "
              f"cos min {cos.min():.6f}, mean {cos.mean():.6f}")


def _wait_closed(client: EdgeClient, deadline_s: float) -> dict:
    """The breaker's snapshot once it is closed again (its probes run on the server's own clock)."""
    end = time.monotonic() + deadline_s
    while (snap := _breaker(client))["state"] != "closed":
        assert time.monotonic() < end, f"the breaker did not close within {deadline_s:.0f} s: {snap}"
        time.sleep(0.2)
    return snap


def _trace(trace_id: str, state: Path) -> dict:
    deadline = time.monotonic() + 10  # the writer flushes about every second
    while True:
        r = subprocess.run([sys.executable, "-m", "edge.cli", "trace", trace_id, "--json", "--state-dir", str(state)],
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


def test_without_a_fallback_engine_failures_trip_it_and_requests_fail_fast(minilm_package, tmp_path):
    rt = start_runtime(tmp_path, "--package", str(minilm_package), "--engine", "onnxruntime", "--device", "cpu",
                       "--fault-engine-error-rate", "1", "--breaker-threshold", "3", "--breaker-cooldown", "60")
    try:
        rt.wait_ready()
        with EdgeClient(rt.address, timeout_s=60) as client:
            assert _breaker(client)["has_fallback"] is False and _breaker(client)["fallback"] is None
            for _ in range(3):
                with pytest.raises(EdgeError) as err:
                    client.embed(["the engine fails"])
                assert err.value.code == ErrorCode.ENGINE_FAILED, err.value
            assert _breaker(client)["state"] == "open"
            t0 = time.monotonic()
            with pytest.raises(EdgeError) as err:
                client.embed(["fail fast"])
            assert err.value.code == ErrorCode.BREAKER_OPEN and time.monotonic() - t0 < 1.0, err.value
            snap = _breaker(client)
            assert snap["failed_fast_requests"] == 1 and snap["trips"] == 1 and "InjectedFault" in snap["last_trip"]["why"]
    finally:
        rt.stop()
