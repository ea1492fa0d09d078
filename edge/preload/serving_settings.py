"""The package's serving settings (manifest ``serving``), validated once at boot.

:class:`ServingSettings` is the only source of serving defaults: the scheduler, admission,
warm-up, preallocation and the engine loop read it through :class:`edge.serving.shapes.BatchShapes`,
never a table of their own. It lives with the package format it is part of (the manifest reader
and the package builder both hold one).

Imported at boot: standard library only, no dataclasses.
"""

from __future__ import annotations

from edge.preload.schema import Invalid, Record, dict_of, integer, list_of, number

__all__ = ["ServingSettings"]


def _ascending(v: object, where: str) -> list[int]:
    items = [integer(x, f"{where}.{i}", ge=1) for i, x in enumerate(list_of(v, where))]
    if not items or items != sorted(set(items)):
        raise Invalid(where, "must be non-empty, positive and strictly ascending")
    return items


def _warm_overrides(v: object, where: str) -> dict:
    """``{"cpu"|"cuda": {"batch_sizes": [..] | null, "repeats": n}}``, each key optional."""
    out = {}
    for kind, spec in dict_of(v, where).items():
        if kind not in ServingSettings.WARM_DEFAULTS:
            raise Invalid(f"{where}.{kind}", f"unknown device kind; known: {', '.join(ServingSettings.WARM_DEFAULTS)}")
        spec = dict_of(spec, f"{where}.{kind}")
        unknown = set(spec) - {"batch_sizes", "repeats"}
        if unknown:
            raise Invalid(f"{where}.{kind}.{sorted(unknown)[0]}", "unexpected field")
        checked: dict[str, list[int] | int | None] = {}
        if spec.get("batch_sizes") is not None:
            checked["batch_sizes"] = _ascending(spec["batch_sizes"], f"{where}.{kind}.batch_sizes")
        elif "batch_sizes" in spec:
            checked["batch_sizes"] = None
        if "repeats" in spec:
            checked["repeats"] = integer(spec["repeats"], f"{where}.{kind}.repeats", ge=1)
        out[kind] = checked
    return out


class ServingSettings(Record):
    """The package's serving settings (manifest ``serving``); every default is here."""

    __slots__ = ("buckets", "batch_sizes", "max_batch_size", "max_batch_tokens", "max_delay_ms",
                 "max_queue_requests", "max_queue_tokens", "max_pending_text_bytes", "default_deadline_ms", "warm",
                 "warm_sample_ids", "extra")
    # The fields' types for mypy: annotations only, so no class attribute clashes with __slots__.
    buckets: list[int]
    batch_sizes: list[int]
    max_batch_size: int
    max_batch_tokens: int
    max_delay_ms: float
    max_queue_requests: int
    max_queue_tokens: int
    max_pending_text_bytes: int
    default_deadline_ms: float
    warm: dict[str, dict]
    warm_sample_ids: list[int] | None
    extra: dict
    _defaults = {
        "buckets": lambda: [16, 32, 64, 128, 256],  # tokens per row, ascending
        "batch_sizes": lambda: [1, 2, 4, 8, 16, 32],  # rows a batch may be padded up to (warmed on CUDA)
        "max_batch_size": lambda: 32,  # rows per batch
        "max_batch_tokens": lambda: 8192,  # rows x bucket length per batch (padded tokens)
        "max_delay_ms": lambda: 2.0,  # oldest text's wait before a partial batch goes, engine busy (ms)
        "max_queue_requests": lambda: 1024,  # texts (not requests) admitted and not yet answered
        "max_queue_tokens": lambda: 262144,  # padded tokens (bucket lengths) admitted, not yet answered
        # UTF-8 bytes of texts received and not yet tokenized (bytes): 16 requests of 64 texts of
        # 32 KiB; with tokenizing stopped at the model's maximum, at most ~5 s of tokenizer work.
        "max_pending_text_bytes": lambda: 32 << 20,
        "default_deadline_ms": lambda: 30_000.0,  # ordering key of a request without a deadline (ms)
        "warm": dict,  # per device kind, overrides of WARM_DEFAULTS
        # The warm-up's input: a text tokenized on the build host by this package's own
        # tokenizer (edge.warmup.WARM_TEXT). With it, boot warms up without waiting for the
        # tokenizer to load; None (older packages): boot tokenizes the text itself.
        "warm_sample_ids": lambda: None,
        "extra": dict,  # settings newer writers add; kept so model_dump round-trips them
    }
    # What warm-up runs per device kind. On a CPU kernels need no loading: one run per bucket
    # at batch 1 pages the weights in and sizes the arena. TorchScript's profiling executor
    # specialises after 2-3 calls (measured with MiniLM: a shape's first 2-3 calls run below
    # steady speed), so CUDA runs each shape 3 times, at every batch size a batch can be
    # padded to (None: ``batch_sizes``).
    WARM_DEFAULTS: dict[str, dict] = {
        "cpu": {"batch_sizes": [1], "repeats": 1},
        "cuda": {"batch_sizes": None, "repeats": 3},
    }

    @classmethod
    def model_validate(cls, d: object, where: str = "serving") -> "ServingSettings":
        d = dict(dict_of(d, where))
        known: dict[str, object] = {}
        for name in ("buckets", "batch_sizes"):
            if name in d:
                known[name] = _ascending(d.pop(name), f"{where}.{name}")
        for name in ("max_batch_size", "max_batch_tokens", "max_queue_requests", "max_queue_tokens",
                     "max_pending_text_bytes"):
            if name in d:
                known[name] = integer(d.pop(name), f"{where}.{name}", ge=1)
        for name in ("max_delay_ms", "default_deadline_ms"):
            if name in d:
                known[name] = number(d.pop(name), f"{where}.{name}", ge=0)
        if "warm" in d:
            known["warm"] = _warm_overrides(d.pop("warm"), f"{where}.warm")
        if d.get("warm_sample_ids") is not None:
            ids = list_of(d.pop("warm_sample_ids"), f"{where}.warm_sample_ids")
            if not ids:
                raise Invalid(f"{where}.warm_sample_ids", "must not be empty")
            known["warm_sample_ids"] = [integer(x, f"{where}.warm_sample_ids.{i}", ge=0) for i, x in enumerate(ids)]
        d.pop("warm_sample_ids", None)
        return cls(**known, extra=d)

    def model_dump(self) -> dict:
        """The JSON form the package builder writes (defaults included, empty overrides left out)."""
        out = {k: getattr(self, k) for k in self.__slots__ if k != "extra"}
        if out["warm_sample_ids"] is None:
            del out["warm_sample_ids"]
        if not out["warm"]:
            del out["warm"]
        out = {k: list(v) if isinstance(v, list) else v for k, v in out.items()}
        return {**out, **self.extra}

    def warm_for(self, kind: str) -> tuple[list[int], int]:
        """(batch sizes, repeats) that warm-up runs per bucket on device kind ``kind``."""
        spec = {**self.WARM_DEFAULTS[kind], **self.warm.get(kind, {})}
        return list(spec["batch_sizes"] or self.batch_sizes), int(spec["repeats"])
