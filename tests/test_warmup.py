"""Warm-up plan and buffers (the CUDA branches run only where CUDA exists)."""

import numpy as np
import pytest

from edge import warmup
from edge.engines.device import device_kind
from edge.serving.shapes import BatchShapes
from edge.preload.serving_settings import ServingSettings

SERVING = {
    "buckets": [16, 32, 64, 128, 256],
    "batch_sizes": [1, 2, 4, 8, 16, 32],
    "max_batch_size": 32,
    "max_batch_tokens": 4096,
}


def shapes_for(serving: dict, engine) -> BatchShapes:
    """The shapes boot derives for ``engine`` from these package settings."""
    return BatchShapes(ServingSettings.model_validate(serving), kind=device_kind(engine.device))


class RecordingEngine:
    name = "onnxruntime"

    def __init__(self, device="cpu"):
        self.device = device
        self.calls = []

    def run(self, ids, mask):
        self.calls.append((ids.shape, int(mask.sum()), ids.base is not None))
        return np.ones((ids.shape[0], 4), dtype=np.float32)


def test_preallocate_bounds_rows_by_batch_tokens():
    buffers = warmup.preallocate(shapes_for(SERVING, RecordingEngine("cpu")), RecordingEngine("cpu"), pad_id=0)
    assert sorted(buffers) == SERVING["buckets"]
    ids, mask = buffers[256]
    assert ids.shape == mask.shape == (16, 256)  # 4096 tokens // 256
    assert buffers[16][0].shape == (32, 16)
    assert ids.dtype == np.int64 and ids.flags.c_contiguous


def test_warm_buckets_runs_views_of_the_preallocated_buffers():
    engine = RecordingEngine("cpu")
    serving = {**SERVING, "warm": {"cpu": {"batch_sizes": [1, 2], "repeats": 2}}}
    shapes = shapes_for(serving, engine)
    buffers = warmup.preallocate(shapes, engine)
    info = warmup.warm_buckets(engine, shapes, list(range(1, 300)), buffers)
    assert info["runs"] == len(engine.calls) == 2 * len(shapes.warm_shapes()) and info["inputs"] == "buffers"
    assert all(is_view for _, _, is_view in engine.calls)
    assert engine.calls[0][0] == (2, 256) and engine.calls[0][1] == 512
    # masks are cleared afterwards, so stale rows never look like real tokens
    assert all(int(m.sum()) == 0 for _, m in buffers.values())


def test_warm_buckets_rejects_bad_engine_output():
    class Broken(RecordingEngine):
        def run(self, ids, mask):
            return np.full((ids.shape[0], 4), np.nan, dtype=np.float32)

    engine = Broken()
    shapes = shapes_for(SERVING, engine)
    buffers = warmup.preallocate(shapes, engine)
    with pytest.raises(RuntimeError, match="warm-up of shape"):
        warmup.warm_buckets(engine, shapes, [1, 2, 3], buffers)


def test_warm_buckets_without_buffers_runs_fresh_padded_batches():
    engine = RecordingEngine("cpu")
    shapes = shapes_for(SERVING, engine)
    info = warmup.warm_buckets(engine, shapes, [101, 7, 8, 102])
    assert info["inputs"] == "numpy" and info["runs"] == len(shapes.warm_shapes())
    # 4 real tokens per row whatever the bucket; fresh arrays, not views
    assert all(mask_sum == 4 and not is_view for _, mask_sum, is_view in engine.calls)


def test_warm_buckets_prefers_the_engines_native_inputs():
    class Native(RecordingEngine):
        def warm_run(self, batch, tokens, ids):
            self.calls.append(("native", batch, tokens, len(ids)))
            return True

    engine = Native()
    shapes = shapes_for(SERVING, engine)
    info = warmup.warm_buckets(engine, shapes, list(range(1, 300)))
    assert info["inputs"] == "native"
    assert engine.calls == [("native", b, t, t) for b, t in shapes.warm_shapes()]


def test_warm_buckets_rejects_bad_native_output():
    class BadNative(RecordingEngine):
        def warm_run(self, batch, tokens, ids):
            return False

    engine = BadNative()
    with pytest.raises(RuntimeError, match="warm-up of shape 1x256"):
        warmup.warm_buckets(engine, shapes_for(SERVING, engine), [1, 2, 3])
