"""Small explicit checks for JSON documents read at boot (the package manifest).

Each checker takes the value and ``where`` (a dotted path such as
``serving.buckets.2``) and returns the value or raises :class:`Invalid`
naming that path, so a bad manifest is refused with the field to fix.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["Record", "FrozenRecord", "Invalid", "dict_of", "list_of", "string", "integer", "number", "one_of", "sha256_hex"]

_HEX = frozenset("0123456789abcdef")  # a set, not a regex: ``re`` would cost boot 10 ms of import


class Invalid(ValueError):
    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


def dict_of(v: object, where: str, keys: set[str] | None = None) -> dict:
    """A JSON object; with ``keys``, exactly those keys may appear (all required)."""
    if not isinstance(v, dict):
        raise Invalid(where, f"expected an object, got {type(v).__name__}")
    if keys is not None:
        extra, missing = set(v) - keys, keys - set(v)
        if extra:
            raise Invalid(f"{where}.{sorted(extra)[0]}", "unexpected field")
        if missing:
            raise Invalid(f"{where}.{sorted(missing)[0]}", "field required")
    return v


def list_of(v: object, where: str) -> list:
    if not isinstance(v, list):
        raise Invalid(where, f"expected a list, got {type(v).__name__}")
    return v


def string(v: object, where: str) -> str:
    if not isinstance(v, str):
        raise Invalid(where, f"expected a string, got {type(v).__name__}")
    return v


def integer(v: object, where: str, ge: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise Invalid(where, f"expected an integer, got {type(v).__name__}")
    if ge is not None and v < ge:
        raise Invalid(where, f"must be >= {ge}, got {v}")
    return v


def number(v: object, where: str, ge: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Invalid(where, f"expected a number, got {type(v).__name__}")
    if ge is not None and v < ge:
        raise Invalid(where, f"must be >= {ge}, got {v}")
    return float(v)


def one_of(v: object, allowed: Iterable, where: str) -> object:
    allowed = tuple(allowed)
    # bool is an int in Python: compare types too, so 1 is not accepted for True.
    if not any(v == a and type(v) is type(a) for a in allowed):
        raise Invalid(where, f"must be one of {', '.join(map(repr, allowed))}, got {v!r}")
    return v


def sha256_hex(v: object, where: str) -> str:
    if not isinstance(v, str) or len(v) != 64 or not _HEX.issuperset(v):
        raise Invalid(where, "expected 64 lowercase hex digits (sha256)")
    return v


class Record:
    """Fields in ``__slots__``, set by keyword or position; equality and repr by field.

    What ``dataclasses`` would generate, without its import (``inspect``, ``ast``:
    about 20 ms on the boot's serial start, before the engine thread can begin).
    ``_defaults`` maps a field to a zero-argument factory.
    """

    __slots__: tuple[str, ...] = ()
    _defaults: dict = {}

    def __init__(self, *args, **kwargs) -> None:
        if len(args) > len(self.__slots__):
            raise TypeError(f"{type(self).__name__} takes at most {len(self.__slots__)} fields")
        kwargs.update(zip(self.__slots__, args))
        unknown = set(kwargs) - set(self.__slots__)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown field(s) {sorted(unknown)}")
        for name in self.__slots__:
            if name in kwargs:
                value = kwargs[name]
            elif name in self._defaults:
                value = self._defaults[name]()
            else:
                raise TypeError(f"{type(self).__name__}: field {name!r} required")
            object.__setattr__(self, name, value)

    def _values(self) -> tuple:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"

    # No __hash__: a class that defines __eq__ and not __hash__ gets __hash__ = None from
    # Python, so records are unhashable (mutable, like a non-frozen dataclass). Spelled out,
    # ``__hash__ = None`` would clash in mypy with FrozenRecord's __hash__.


class FrozenRecord(Record):
    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __hash__(self) -> int:
        return hash(self._values())
