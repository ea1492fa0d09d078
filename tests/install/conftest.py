"""Fixtures of the installer's tests: keys, three small bundles packed once, a device root."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.archives import fake_bundle, keygen, pack


@pytest.fixture(scope="session")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """``{"trusted": (private, public), "stranger": (...)}``."""
    d = tmp_path_factory.mktemp("keys")
    return {"trusted": keygen(d / "trusted"), "stranger": keygen(d / "stranger")}


@pytest.fixture(scope="session")
def bundles(tmp_path_factory) -> dict[int, Path]:
    d = tmp_path_factory.mktemp("bundles")
    return {v: fake_bundle(d / f"v{v}", v) for v in (1, 2, 3)}


@pytest.fixture(scope="session")
def archives(tmp_path_factory, keys, bundles) -> dict[int, Path]:
    """Good archives of bundles 1, 2, 3, signed by the trusted key."""
    d = tmp_path_factory.mktemp("archives")
    return {v: pack(b, keys["trusted"][0], d / f"v{v}.edgebundle") for v, b in bundles.items()}


@pytest.fixture
def root(tmp_path, keys) -> Path:
    """An empty device root that trusts the "trusted" key."""
    r = tmp_path / "root"
    (r / "etc/edge/keys").mkdir(parents=True)
    (r / "etc/edge/keys/edge-signing.pub").write_bytes(keys["trusted"][1].read_bytes())
    return r
