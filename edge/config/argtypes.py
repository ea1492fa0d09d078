"""argparse types: every number a command line takes, checked by one function.

:func:`number` parses with ``kind`` (``int``, ``float`` or any converter that raises ValueError)
and checks the value against a rule; each error says what was given and what to give instead,
and names the ``EDGE_*`` variable when the value may have come from one (a flag's default is
its variable, so argparse checks both alike). Every CLI of the project, device side and build
host, takes its numbers from here.

The bottom layer: standard library only; argparse is imported when a type is made, which
happens only when a parser is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["number", "positive_number", "positive_int", "parse_bytes", "parse_listen"]

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def number(kind: Callable[[str], Any], noun: str, *, ok: Callable[[Any], bool] | None = None,
           rule: str = "", env_name: str | None = None) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, refused unless ``ok(value)``.

    ``noun`` says what the text should be ("a number of seconds"); ``rule`` says which values
    pass ``ok`` ("seconds >= 0"). ``env_name``: the variable a default comes from, named in both
    errors. A rule written with comparisons refuses NaN, which compares false."""
    import argparse

    where = f" (from the flag or {env_name})" if env_name else ""

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}{where}") from None
        if ok is not None and not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r}: give {rule}{where}")
        return value

    convert.__name__ = noun.replace(" ", "_")  # argparse names the type in its own errors
    return convert


def positive_number(unit: str) -> Callable[[str], float]:
    """A finite number of ``unit`` (seconds, ms) above 0."""
    return number(float, f"a number of {unit}", ok=lambda v: 0 < v < math.inf, rule=f"a number of {unit} above 0")


def positive_int(what: str) -> Callable[[str], int]:
    """A whole number of ``what`` (e.g. "tokens"), 1 or more."""
    return number(int, "a whole number", ok=lambda v: v >= 1, rule=f"a number of {what} above 0")


def parse_bytes(text: str) -> int:
    """``65536``, ``512K``, ``256M``, ``1G`` (binary units, an optional ``iB``/``B``) as bytes."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    digits = t[:len(t) - len(unit)].strip()
    if not digits.isdigit():
        raise ValueError(f"{text!r} is not a size (bytes, or a number with K, M or G)")
    return int(digits) * _UNITS[unit]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` as (host, port); no host: 127.0.0.1;
    port 0: one the kernel picks (the ``metrics.started`` log line names it). ValueError says
    what is wrong."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host = ""
    if host.count(":") and not host.startswith("["):
        raise ValueError(f"{text!r}: write an IPv6 host in brackets, e.g. [::1]:9464")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r}: port {port!r} is not a number in 0..65535")
    return host, int(port)
