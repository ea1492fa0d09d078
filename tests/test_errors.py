"""Error codes are a contract with client apps: pinned here, documented in docs/protocol.md."""

from __future__ import annotations

import pathlib
import re

import pytest

from edge import errors
from edge.errors import (
    BootError, EdgeError, EngineError, ErrorCode, FlowError, InternalError, PackageError, RequestError,
    TokenizerError, error_class_for,
)

# Never change a line of this table; append when a code is added.
PINNED = {
    1000: "MALFORMED_FRAME", 1001: "WRONG_FRAME_COUNT", 1002: "UNSUPPORTED_VERSION", 1003: "UNKNOWN_TYPE",
    1004: "INVALID_FIELD", 1005: "EMPTY_TEXT", 1006: "TEXT_TOO_LONG", 1007: "TOO_MANY_TEXTS",
    1008: "INVALID_OPTION", 1009: "TOO_MANY_TOKENS", 1010: "FRAME_TOO_LARGE", 1011: "DUPLICATE_REQUEST_ID",
    2000: "OVERLOADED", 2001: "DEADLINE_EXCEEDED", 2002: "CANCELLED", 2003: "SHUTTING_DOWN", 2004: "NOT_READY",
    2005: "UNKNOWN_REQUEST_ID", 2006: "BREAKER_OPEN",
    3000: "INTERNAL", 3001: "ENGINE_FAILED",
    4000: "PACKAGE_INVALID", 4001: "PACKAGE_FILE_MISSING", 4002: "PACKAGE_HASH_MISMATCH",
    4003: "PACKAGE_SIZE_MISMATCH", 4010: "TOKENIZER_INVALID", 4011: "TOKENIZER_UNSUPPORTED",
    4020: "ENGINE_UNAVAILABLE", 4021: "ENGINE_LOAD_FAILED", 4030: "BOOT_STAGE_FAILED",
    4031: "SNAPSHOT_STALE", 4032: "METRICS_UNAVAILABLE",
}


def test_pinned_codes_never_change():
    current = {int(c): c.name for c in ErrorCode}
    for code, name in PINNED.items():
        assert current.get(code) == name, f"code {code} must stay {name}"
    # a new code is fine only if it is appended here too
    assert set(current) == set(PINNED), f"new codes {set(current) - set(PINNED)}: add them to PINNED and docs"


def test_codes_unique_and_in_known_ranges():
    values = [int(c) for c in ErrorCode]
    assert len(values) == len(set(values))
    assert {v // 1000 for v in values} == {1, 2, 3, 4}


@pytest.mark.parametrize(
    "code,cls,recoverable",
    [
        (ErrorCode.EMPTY_TEXT, RequestError, False),
        (ErrorCode.OVERLOADED, FlowError, True),
        (ErrorCode.SHUTTING_DOWN, FlowError, True),
        (ErrorCode.ENGINE_FAILED, InternalError, True),
        (ErrorCode.PACKAGE_HASH_MISMATCH, BootError, False),
    ],
)
def test_class_by_range(code, cls, recoverable):
    assert error_class_for(code) is cls
    exc = error_class_for(code)("msg", code)
    assert exc.code == code and exc.recoverable is recoverable and isinstance(exc, EdgeError)


def test_to_wire_and_str():
    exc = RequestError("texts[0] is empty", ErrorCode.EMPTY_TEXT)
    assert exc.to_wire() == {"code": 1005, "name": "EMPTY_TEXT", "message": "texts[0] is empty"}
    assert str(exc) == "[1005 EMPTY_TEXT] texts[0] is empty"
    boot = PackageError("hash differs", ErrorCode.PACKAGE_HASH_MISMATCH, file="model.ort", stage="map weights",
                        setting="--package")
    assert boot.file == "model.ort"
    assert str(boot) == "boot stage 'map weights' failed: [4002 PACKAGE_HASH_MISMATCH] hash differs (change: --package)"
    assert TokenizerError("x").code == ErrorCode.TOKENIZER_INVALID
    assert EngineError("x").code == ErrorCode.ENGINE_LOAD_FAILED


def test_all_names_exported():
    for name in errors.__all__:
        assert hasattr(errors, name)


def test_every_code_is_documented_in_protocol_md():
    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "protocol.md").read_text()
    rows = dict(re.findall(r"^\|\s*(\d{4})\s*\|\s*`?([A-Z_]+)`?\s*\|", doc, re.M))
    missing = [f"{int(c)} {c.name}" for c in ErrorCode if rows.get(str(int(c))) != c.name]
    assert not missing, f"docs/protocol.md error table lacks: {missing}"
