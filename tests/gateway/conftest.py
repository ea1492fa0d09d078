"""The gateway's tests: huggingface_hub let out to the local gateway."""

from __future__ import annotations

import pytest
from huggingface_hub import constants as hub_constants


@pytest.fixture(autouse=True)
def hub_online(monkeypatch):
    """huggingface_hub reads HF_HUB_OFFLINE once, at import, and then refuses every URL, a local
    gateway's too. The reference fixtures of other test modules set it (they must never reach the
    Hub), so whether it is set here depends on which test ran first: clear it for these tests.
    An app that runs with HF_HUB_OFFLINE=1 meets the same refusal (docs/gateway.md)."""
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
