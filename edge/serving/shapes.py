"""Batch shapes: the one answer to "which bucket, how many rows, which warmed size".

Derived once from :class:`edge.preload.serving_settings.ServingSettings`, the model's maximum length and the
device kind. Admission asks it for a text's bucket, the scheduler for the rows of a batch,
warm-up and preallocation for the shapes to warm and the buffers to make, the engine loop for
the row count to pad a batch to. Immutable after construction, so every thread may read it.
"""

from __future__ import annotations

import bisect

from edge.preload.serving_settings import ServingSettings
from edge.serving.call_cost import PRIOR_TOKENS

__all__ = ["BatchShapes"]


# What one more engine call costs, in tokens of work, where nothing better is known: the engine loop
# learns the figure from its own calls (edge/serving/call_cost.py, which explains the prior).
CALL_COST_TOKENS = PRIOR_TOKENS


class BatchShapes:
    def __init__(self, settings: ServingSettings, *, max_seq_length: int | None = None, kind: str = "cpu") -> None:
        self.settings = settings
        self.kind = kind  # "cpu" | "cuda": which warm settings apply, whether batches are padded
        self.buckets = sorted({int(b) for b in settings.buckets})  # tokens per row, ascending
        if not self.buckets or self.buckets[0] <= 0:
            raise ValueError(f"buckets must be positive token counts, got {self.buckets}")
        top = self.buckets[-1]
        # Tokens per text, specials included; a longer text is truncated or refused.
        self.max_text_tokens = min(int(max_seq_length), top) if max_seq_length else top
        # Rows per batch of each bucket: padded tokens rows x bucket stay within max_batch_tokens,
        # and a bucket longer than that still runs one row at a time.
        self._rows = {b: max(1, min(settings.max_batch_size, settings.max_batch_tokens // b)) for b in self.buckets}
        sizes, self.warm_repeats = settings.warm_for(kind)
        # Batch sizes warmed per bucket, ascending; a bucket's batches are padded up to one of
        # them on CUDA (graphs and TensorRT profiles exist only for warmed shapes).
        self._warmed = {b: [s for s in sorted(set(sizes)) if s <= self._rows[b]] for b in self.buckets}
        self.pads_to_warmed = kind == "cuda"  # a CPU gains nothing from running padding rows
        # Columns likewise: CUDA runs a bucket's whole length (graphs and TensorRT profiles exist per
        # shape), while a CPU engine (ONNX Runtime; TorchScript, whose profiling executor is off on a
        # CPU) takes any length, so a batch runs at its own longest text: the columns past it are
        # padding the engine would compute for nothing. The bucket still groups texts of like length.
        self.pads_to_bucket = kind == "cuda"

    def bucket_for(self, n_tokens: int) -> int | None:
        """The smallest bucket that holds ``n_tokens``; None when none does."""
        i = bisect.bisect_left(self.buckets, n_tokens)
        return self.buckets[i] if i < len(self.buckets) else None

    def rows(self, bucket: int) -> int:
        """The most rows a batch of ``bucket`` holds (the size of its input buffers)."""
        return self._rows[bucket]

    def warm_shapes(self) -> list[tuple[int, int]]:
        """(rows, tokens) of every shape warm-up runs, largest first so the allocator's first
        blocks fit every later shape."""
        shapes = [(b, t) for t in self.buckets for b in self._warmed[t]]
        shapes.sort(key=lambda s: (s[0] * s[1], s[1]), reverse=True)
        return shapes

    def padded_rows(self, n: int, bucket: int) -> int:
        """Rows to run for ``n`` texts of ``bucket``: the smallest warmed size >= n on CUDA, else n."""
        if self.pads_to_warmed:
            for size in self._warmed[bucket]:
                if size >= n:
                    return size
        return n

    def groups(self, lengths: list[int], call_tokens: float = CALL_COST_TOKENS) -> list[list[int]]:
        """The engine calls that run one batch, as lists of indices into ``lengths`` (its texts'
        token counts). CUDA: one call, in order (its shapes are fixed). A CPU runs any width, so
        the texts are sorted by length and cut into calls wherever the padding a cut saves is worth
        more than a call's own cost (``call_tokens``, tokens of work; the engine loop's learned
        figure): a 64-token text no longer makes thirty 34-token texts run 64 wide. The cuts
        minimise rows x width summed over the calls, plus that cost per call (exactly: the groups
        of a sorted list are runs of it)."""
        order = list(range(len(lengths)))
        if self.pads_to_bucket or len(order) < 2:
            return [order]
        order.sort(key=lengths.__getitem__)
        longest = [lengths[i] for i in order]  # the width of a run ending here
        n = len(order)
        best = [0.0] + [float("inf")] * n  # best[j]: the cost of the first j texts
        cut = [0] * (n + 1)
        for j in range(1, n + 1):
            for i in range(j):
                cost = best[i] + (j - i) * longest[j - 1] + call_tokens
                if cost < best[j]:
                    best[j], cut[j] = cost, i
        runs, j = [], n
        while j > 0:
            runs.append(order[cut[j]:j])
            j = cut[j]
        return runs[::-1]

    def width(self, bucket: int, longest: int) -> int:
        """Tokens per row to run a batch of ``bucket`` whose longest text has ``longest`` tokens:
        the bucket on CUDA, else the longest text (never over the bucket)."""
        return bucket if self.pads_to_bucket else max(1, min(longest, bucket))

    def as_dict(self) -> dict:
        """For ``stats``: string keys only."""
        return {"buckets": list(self.buckets), "batch_caps": {str(b): r for b, r in self._rows.items()},
                "max_text_tokens": self.max_text_tokens, "device_kind": self.kind,
                "pads_to_bucket": self.pads_to_bucket,
                "warm_shapes": [list(s) for s in self.warm_shapes()], "warm_repeats": self.warm_repeats}
