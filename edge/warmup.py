"""Warm-up: make the first real request as fast as the thousandth.

Three stages, run by boot (``edge/boot.py`` orders them per engine):

* ``prewarm_device``: on CUDA create the context, and reserve
  device memory in torch's caching allocator (bounded by a setting) so serving
  never calls cudaMalloc. ONNX Runtime sizes its arena at session creation
  (engine options); on the CPU there is nothing to do.
* ``preallocate``: one pair of input buffers per bucket, shape
  (rows per batch, bucket), that the engine loop pads batches into. Pinned
  host memory when the engine runs on CUDA, so host-to-device copies are async.
* ``warm_buckets``: run every (batch size, bucket) shape that will be served,
  largest first so the allocator's first blocks fit every later shape. On a fresh CPU
  boot only the smallest runs before READY and the engine loop runs the rest when it is
  idle (``edge serve --warm-up``, :func:`edge.runtime.engine_chain.warm_plan`). An engine
  with ``warm_run`` (ONNX Runtime) warms through its own native buffers, without
  numpy: boot warms it while the main thread is still importing numpy.

Shapes, repeat counts and buffer rows come from :class:`edge.serving.shapes.BatchShapes`,
which derives them from the package's serving settings and the device kind: the same
object the scheduler and the engine loop ask, so warm-up runs exactly the shapes served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge.engines.device import device_kind

if TYPE_CHECKING:
    import numpy as np

    from edge.serving.shapes import BatchShapes

__all__ = ["WARM_TEXT", "prewarm_device", "preallocate", "warm_buckets"]

# The warm-up's input: ordinary prose, long enough to fill the largest bucket. The
# package builder stores its ids (``serving.warm_sample_ids``), so boot need not wait
# for the tokenizer; older packages have boot tokenize it.
WARM_TEXT = "The device warms every bucket with ordinary text before it reports ready. " * 40


def prewarm_device(engine, reserve_mb: int) -> dict:
    """Create the CUDA context and reserve up to ``reserve_mb`` MiB; a no-op on the CPU."""
    if device_kind(engine.device) != "cuda":
        return {"device": "cpu"}
    if engine.name == "torchscript":
        import torch

        device = torch.device(engine.device)
        # The context is created by the first CUDA call. Streams are per
        # thread in torch, so the engine creates its own in the thread that
        # serves; here only the context and the allocator matter.
        torch.cuda.init()
        torch.cuda.set_device(device)
        torch.cuda.synchronize(device)
        # A tensor that is freed stays in the caching allocator, so later
        # batches reuse the block instead of calling cudaMalloc mid-request.
        free, total = torch.cuda.mem_get_info(device)
        reserve = min(reserve_mb << 20, free // 4)
        block = torch.empty(reserve, dtype=torch.uint8, device=device)
        del block
        return {
            "device": engine.device,
            "reserved_bytes": int(torch.cuda.memory_reserved(device)),
            "free_bytes": int(free),
            "total_bytes": int(total),
        }
    # ONNX Runtime creates its CUDA context and arena with the session.
    return {"device": engine.device}


def _host_buffer(shape: tuple[int, int], pinned: bool) -> np.ndarray:
    import numpy as np  # not at module level: the ONNX Runtime warm-up runs without it

    if pinned:
        import torch

        return torch.zeros(shape, dtype=torch.int64).pin_memory().numpy()
    return np.zeros(shape, dtype=np.int64)


def preallocate(shapes: BatchShapes, engine, pad_id: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Input buffers per bucket: {tokens: (input_ids, attention_mask)}, each (shapes.rows(bucket), tokens)."""
    pinned = shapes.kind == "cuda" and engine.name == "torchscript"
    buffers = {}
    for tokens in shapes.buckets:
        rows = shapes.rows(tokens)
        ids = _host_buffer((rows, tokens), pinned)
        ids.fill(pad_id)
        mask = _host_buffer((rows, tokens), pinned)
        buffers[tokens] = (ids, mask)
    return buffers


def warm_buckets(engine, shapes: BatchShapes, sample_ids: list[int], buffers: dict | None = None,
                 plan: list[tuple[int, int]] | None = None) -> dict:
    """Run every shape of ``plan`` (default: ``shapes.warm_shapes()``) ``shapes.warm_repeats`` times.

    Rows hold ``sample_ids`` (a real text's ids, specials included) so the
    engine sees the value ranges of serving, whatever the tokenizer. An engine
    with ``warm_run(batch, tokens, ids)`` runs on its own native inputs;
    otherwise numpy batches are run, through views of the preallocated
    ``buffers`` when given (pinned host memory on CUDA).
    """
    import time

    runs = 0
    native = getattr(engine, "warm_run", None)
    plan = shapes.warm_shapes() if plan is None else plan
    fastest_ms: dict[str, float] = {}  # "RxT": the fastest run of the shape, the breaker's yardstick
    for batch, tokens in plan:
        row = list(sample_ids[:tokens])
        for _ in range(shapes.warm_repeats):
            t0 = time.perf_counter()
            ok = native(batch, tokens, row) if native is not None else _warm_numpy(engine, buffers, batch, tokens, row)
            ms = (time.perf_counter() - t0) * 1000.0
            if not ok:
                raise RuntimeError(f"warm-up of shape {batch}x{tokens} gave bad output")
            key = f"{batch}x{tokens}"
            fastest_ms[key] = round(min(ms, fastest_ms.get(key, ms)), 3)
            runs += 1
    return {"shapes": len(plan), "runs": runs, "repeats": shapes.warm_repeats,
            "inputs": "native" if native is not None else ("buffers" if buffers is not None else "numpy"),
            "fastest_ms": fastest_ms}


def _warm_numpy(engine, buffers: dict | None, batch: int, tokens: int, row: list[int]) -> bool:
    """One numpy batch of ``row`` (left-aligned, the rest padding); True when the output is sound."""
    import numpy as np

    if buffers is not None:
        ids, mask = buffers[tokens]
        view_ids, view_mask = ids[:batch], mask[:batch]  # (B, T)
    else:
        view_ids, view_mask = np.zeros((batch, tokens), np.int64), np.zeros((batch, tokens), np.int64)
    view_ids[:, : len(row)] = row
    view_mask[:, : len(row)] = 1
    try:
        out = engine.run(view_ids, view_mask)  # (B, D)
        return out.shape[0] == batch and bool(np.isfinite(out).all())
    finally:
        view_mask[:] = 0  # stale rows must never look like real tokens
