"""The manifest's ``selftest`` record (``edge/preload/manifest.py`` reads it; docs/selftest.md).

Apart from the manifest's module only to keep each under ~400 lines; ``edge.preload.manifest``
re-exports :class:`SelftestReference`.
"""

from __future__ import annotations

from edge.preload.schema import Invalid, Record, dict_of, list_of, number, string

__all__ = ["SelftestReference"]


class SelftestReference(Record):
    """The manifest's ``selftest``: what a healthy server must answer for this package.

    ``embedding`` is ``text`` embedded on the build host by the package's own engine path
    (image/package.py); ``edge selftest`` embeds ``text`` through the running server and wants
    a cosine of at least ``min_cosine`` with it, and the boot's exec-to-ready time within
    ``boot_budget_ms`` (a restored start, or any start where a snapshot can be taken) or, for a
    fresh start where no snapshot can be taken, within ``fresh_boot_budget_ms`` of the engine it
    runs (measured by the package build, image/fresh_boot.py; docs/selftest.md).
    """

    __slots__ = (
        "text",  # str: the reference text, not empty
        "embedding",  # list[float]: (output_dim,), the text's embedding as the package computes it
        "min_cosine",  # float in (0, 1]: least cosine of a served embedding with ``embedding``
        "boot_budget_ms",  # float > 0: exec to ready (ms) a boot of this package must stay within
        # {engine: float > 0}: exec to ready (ms) of a fresh start (no snapshot) of that engine, where
        # no snapshot can be taken; {} in packages built before it (boot_budget_ms then holds)
        "fresh_boot_budget_ms",
        "computed_with",  # dict: how ``embedding`` was computed (engine, file, device); informative
        "extra",  # dict: fields newer writers add
    )
    # The fields' types for mypy: annotations only, so no class attribute clashes with __slots__.
    text: str
    embedding: list[float]
    min_cosine: float
    boot_budget_ms: float
    computed_with: dict
    extra: dict
    fresh_boot_budget_ms: dict[str, float]
    _defaults = {"fresh_boot_budget_ms": dict, "computed_with": dict, "extra": dict}

    def fresh_budget(self, engine: str | None) -> float | None:
        """The fresh start's budget of ``engine`` (ms); None when the package names none for it."""
        return self.fresh_boot_budget_ms.get(engine) if engine else None

    @classmethod
    def model_validate(cls, d: object, where: str = "selftest") -> "SelftestReference":
        d = dict(dict_of(d, where))
        for name in ("text", "embedding", "min_cosine", "boot_budget_ms"):
            if name not in d:
                raise Invalid(f"{where}.{name}", "field required")
        text = string(d.pop("text"), f"{where}.text")
        if not text.strip():
            raise Invalid(f"{where}.text", "must not be empty or whitespace only")
        values = list_of(d.pop("embedding"), f"{where}.embedding")
        vector = [number(x, f"{where}.embedding.{i}") for i, x in enumerate(values)]
        if not any(vector) or any(x != x or x in (float("inf"), float("-inf")) for x in vector):
            raise Invalid(f"{where}.embedding", "must be finite and not all zero")
        min_cosine = number(d.pop("min_cosine"), f"{where}.min_cosine")
        if not 0 < min_cosine <= 1:
            raise Invalid(f"{where}.min_cosine", f"must be in (0, 1], got {min_cosine}")
        budget = number(d.pop("boot_budget_ms"), f"{where}.boot_budget_ms")
        if not 0 < budget < float("inf"):
            raise Invalid(f"{where}.boot_budget_ms", f"must be a number of ms above 0, got {budget}")
        fresh = {}
        for engine, ms in dict_of(d.pop("fresh_boot_budget_ms", {}), f"{where}.fresh_boot_budget_ms").items():
            ms = number(ms, f"{where}.fresh_boot_budget_ms.{engine}")
            if not 0 < ms < float("inf"):
                raise Invalid(f"{where}.fresh_boot_budget_ms.{engine}", f"must be a number of ms above 0, got {ms}")
            fresh[string(engine, f"{where}.fresh_boot_budget_ms")] = ms
        computed_with = dict_of(d.pop("computed_with", {}), f"{where}.computed_with")
        return cls(text=text, embedding=vector, min_cosine=min_cosine, boot_budget_ms=budget,
                   fresh_boot_budget_ms=fresh, computed_with=computed_with, extra=d)
