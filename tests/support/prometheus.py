"""Helpers of the metrics tests: the parsed exposition, promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def samples(text: str | bytes) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    if isinstance(text, bytes):
        text = text.decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"sample {key} twice"
            out[key] = s.value
    return out


def value(found: dict, metric: str, /, **labels) -> float:
    """The value of one sample (labels may be given as numbers)."""
    key = (metric, tuple(sorted((k, str(v)) for k, v in labels.items())))
    assert key in found, f"no sample {metric}{labels}; have {sorted(k for k in found if k[0] == metric)}"
    return found[key]


def total(found: dict, name: str) -> float:
    """The sum of a metric's samples over all its labels."""
    return sum(v for (n, _), v in found.items() if n == name)


def promtool_check(data: bytes) -> None:
    """``promtool check metrics`` on ``data``: passes, or the test fails with its findings; skipped
    (with the reason) where promtool is not installed."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    r = subprocess.run([promtool, "check", "metrics"], input=data, capture_output=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (
        f"promtool check metrics: exit {r.returncode}\n{r.stdout.decode()}{r.stderr.decode()}")


def scrape_until(read, done, timeout_s: float = 10.0) -> dict:
    """``samples(read())`` once ``done(samples)`` holds; AssertionError with the last ones after
    ``timeout_s``. (The server counts a reply after it sent it, so the client may be first.)"""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        found = samples(read())
        if done(found):
            return found
        assert time.monotonic() < deadline, f"waited {timeout_s} s; last scrape: {found}"
        time.sleep(0.01)  # poll interval
