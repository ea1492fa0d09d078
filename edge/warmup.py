"""Warm-up: make the first real request as fast as the thousandth.

Three stages, run by boot (``edge/boot.py`` orders them per engine):

* ``prewarm_device``: on CUDA create the context, and reserve
  device memory in torch's caching allocator (bounded by a setting) so serving
  never calls cudaMalloc. ONNX Runtime sizes its arena at session creation
  (engine options); on the CPU there is nothing to do.
* ``preallocate``: one pair of input buffers per bucket, shape
  (max_batch_size, bucket), that the engine loop pads batches into. Pinned
  host memory when the engine runs on CUDA, so host-to-device copies are async.
* ``warm_buckets``: run every (batch size, bucket) shape the package lists,
  largest first so the allocator's first blocks fit every later shape. An engine
  with ``warm_run`` (ONNX Runtime) warms through its own native buffers, without
  numpy: boot warms it while the main thread is still importing numpy.

Shapes and repeat counts come from the package's ``serving`` settings, per
device kind (``warm.cpu`` / ``warm.cuda``). On a CPU kernels need no loading,
so the default there is one run per bucket at batch 1: it pages the weights in
and sizes the arena without paying seconds of compute at boot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["WARM_TEXT", "WarmPlan", "warm_plan", "prewarm_device", "preallocate", "warm_buckets"]

# The warm-up's input: ordinary prose, long enough to fill the largest bucket. The
# package builder stores its ids (``serving.warm_sample_ids``), so boot need not wait
# for the tokenizer; older packages have boot tokenize it.
WARM_TEXT = "The device warms every bucket with ordinary text before it reports ready. " * 40

# Per device kind: which batch sizes to warm per bucket and how often.
# TorchScript's profiling executor specialises after 2-3 calls (LAB.md), so
# CUDA warms each shape 3 times.
DEFAULT_WARM = {
    "cpu": {"batch_sizes": [1], "repeats": 1},
    "cuda": {"batch_sizes": None, "repeats": 3},  # None: every serving batch size
}
DEFAULT_CUDA_RESERVE_MB = 512  # upper bound of the up-front reservation


class WarmPlan:
    """The shapes to warm: list of (batch, tokens), largest first, and repeats."""

    def __init__(self, shapes: list[tuple[int, int]], repeats: int) -> None:
        self.shapes = shapes
        self.repeats = repeats

    def largest_tokens(self) -> int:
        return max((b * t for b, t in self.shapes), default=0)


def _device_kind(engine) -> str:
    return "cuda" if str(getattr(engine, "device", "cpu")).startswith("cuda") else "cpu"


def warm_plan(serving: dict, engine) -> WarmPlan:
    kind = _device_kind(engine)
    settings = {**DEFAULT_WARM[kind], **(serving.get("warm", {}) or {}).get(kind, {})}
    batch_sizes = settings["batch_sizes"] or serving["batch_sizes"]
    max_tokens = serving["max_batch_tokens"]
    shapes = [
        (b, t)
        for t in serving["buckets"]
        for b in batch_sizes
        if b <= serving["max_batch_size"] and b * t <= max_tokens
    ]
    shapes.sort(key=lambda s: (s[0] * s[1], s[1]), reverse=True)
    return WarmPlan(shapes, int(settings["repeats"]))


def prewarm_device(engine, reserve_mb: int = DEFAULT_CUDA_RESERVE_MB) -> dict:
    """Create the CUDA context and reserve memory; a no-op on the CPU."""
    if _device_kind(engine) != "cuda":
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


def preallocate(serving: dict, engine, pad_id: int = 0) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Input buffers per bucket: {tokens: (input_ids, attention_mask)}, each (max_batch, tokens)."""
    pinned = _device_kind(engine) == "cuda" and engine.name == "torchscript"
    buffers = {}
    for tokens in serving["buckets"]:
        rows = max(1, min(serving["max_batch_size"], serving["max_batch_tokens"] // tokens))
        ids = _host_buffer((rows, tokens), pinned)
        ids.fill(pad_id)
        mask = _host_buffer((rows, tokens), pinned)
        buffers[tokens] = (ids, mask)
    return buffers


def warm_buckets(engine, plan: WarmPlan, sample_ids: list[int], buffers: dict | None = None) -> dict:
    """Run every planned shape ``plan.repeats`` times.

    Rows hold ``sample_ids`` (a real text's ids, specials included) so the
    engine sees the value ranges of serving, whatever the tokenizer. An engine
    with ``warm_run(batch, tokens, ids)`` runs on its own native inputs;
    otherwise numpy batches are run, through views of the preallocated
    ``buffers`` when given (pinned host memory on CUDA).
    """
    runs = 0
    native = getattr(engine, "warm_run", None)
    for batch, tokens in plan.shapes:
        if buffers is not None and batch > buffers[tokens][0].shape[0]:
            continue
        row = list(sample_ids[:tokens])
        for _ in range(plan.repeats):
            ok = native(batch, tokens, row) if native is not None else _warm_numpy(engine, buffers, batch, tokens, row)
            if not ok:
                raise RuntimeError(f"warm-up of shape {batch}x{tokens} gave bad output")
            runs += 1
    return {"shapes": len(plan.shapes), "runs": runs, "repeats": plan.repeats,
            "inputs": "native" if native is not None else ("buffers" if buffers is not None else "numpy")}


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
