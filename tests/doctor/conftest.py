"""Fixtures of ``edge doctor``'s tests: an empty device root, a host whose commands answer from a table."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from support.doctor_fakes import FakeHost


@pytest.fixture
def host():
    return FakeHost()


@pytest.fixture
def root():
    """An empty device root; short (an AF_UNIX path under it holds 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="edge-dr-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
