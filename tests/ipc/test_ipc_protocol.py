"""Unit tier: exact bytes, frame counts and the error code of every refusal."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

from edge.errors import ErrorCode
from edge.ipc import protocol as P
from edge.ipc.validate import parse_request

E = ErrorCode


def frames(mtype="infer", body=None, v=1, enc=P.MSGPACK):
    return [P.encode_obj({"v": v, "type": mtype}, enc), P.encode_obj({} if body is None else body, enc)]


def code_of(fr, limits=P.Limits()):
    with pytest.raises(P.ProtocolError) as ei:
        parse_request(fr, limits)
    return ei.value.code


def test_header_bytes_are_exact():
    # fixmap(2) "v" 1 "type" "infer"
    assert P.encode_request("infer", {"texts": ["hi"]}) == [
        b"\x82\xa1v\x01\xa4type\xa5infer",
        b"\x81\xa5texts\x91\xa2hi",
    ]
    assert P.encode_request("health", {}, P.JSON) == [b'{"v":1,"type":"health"}', b"{}"]


def test_parse_infer_defaults_and_options():
    mtype, m = parse_request(frames("infer", {"texts": ["a b", "c"]}))
    assert mtype == "infer" and m == P.InferMsg(["a b", "c"], None, None, 1, True, text_bytes=4)
    _, m = parse_request(frames("infer", {"texts": ["x"], "request_id": "r1", "deadline_ms": 50, "priority": 0, "truncate": False}))
    assert (m.request_id, m.deadline_ms, m.priority, m.truncate) == ("r1", 50.0, 0, False)
    _, m = parse_request(frames("infer", {"texts": ["x"], "request_id": 7}, enc=P.JSON))
    assert m.request_id == 7


@pytest.mark.parametrize("mtype,body", [("health", {}), ("stats", {}), ("cancel", {"request_id": "a"})])
def test_parse_other_types(mtype, body):
    for enc in (P.MSGPACK, P.JSON):
        t, m = parse_request(frames(mtype, body, enc=enc))
        assert t == mtype


@pytest.mark.parametrize(
    "fr,code",
    [
        ([], E.WRONG_FRAME_COUNT),
        ([b"\x82\xa1v\x01\xa4type\xa6health"], E.WRONG_FRAME_COUNT),
        (frames("health") + [b""], E.WRONG_FRAME_COUNT),
        ([b"\xc1", b"\x80"], E.MALFORMED_FRAME),  # 0xc1 is never valid msgpack
        ([b"\x82\xa1v\x01", b"\x80"], E.MALFORMED_FRAME),  # truncated map
        ([b"\x82\xa1v\x01\xa4type\xa6health\x00", b"\x80"], E.MALFORMED_FRAME),  # trailing bytes
        ([b'{"v":1,"type":"health"', b"{}"], E.MALFORMED_FRAME),  # truncated JSON
        ([b"\x81\xa1v\xff", b"\x80"], E.INVALID_FIELD),  # 1-key header (v=-1)
        ([P.encode_obj([1, "health"]), b"\x80"], E.INVALID_FIELD),  # header not a map
        ([P.encode_obj({"v": "1", "type": "health"}), b"\x80"], E.INVALID_FIELD),
        ([P.encode_obj({"v": True, "type": "health"}), b"\x80"], E.INVALID_FIELD),
        ([P.encode_obj({"v": 1, "type": "health", "x": 1}), b"\x80"], E.INVALID_FIELD),
        ([P.encode_obj({1: 1, "type": "health"}), b"\x80"], E.MALFORMED_FRAME),  # non-string key
        (frames("health", v=2), E.UNSUPPORTED_VERSION),
        (frames("health", v=0, enc=P.JSON), E.UNSUPPORTED_VERSION),
        (frames("embed"), E.UNKNOWN_TYPE),
        ([frames("health")[0], b"\xc1"], E.MALFORMED_FRAME),
        ([frames("health")[0], P.encode_obj([])], E.INVALID_FIELD),  # body not a map
        (frames("health", {"x": 1}), E.INVALID_FIELD),
        (frames("infer", {}), E.INVALID_FIELD),
        (frames("infer", {"texts": "hello"}), E.INVALID_FIELD),
        (frames("infer", {"texts": []}), E.INVALID_FIELD),
        (frames("infer", {"texts": [b"bytes"]}), E.INVALID_FIELD),
        (frames("infer", {"texts": [1]}), E.INVALID_FIELD),
        (frames("infer", {"texts": ["ok"], "unknown": 1}), E.INVALID_FIELD),
        (frames("infer", {"texts": [""]}), E.EMPTY_TEXT),
        (frames("infer", {"texts": ["ok", " \t\n\u3000"]}), E.EMPTY_TEXT),
        (frames("infer", {"texts": ["x" * 32769]}), E.TEXT_TOO_LONG),
        (frames("infer", {"texts": ["\u00e9" * 16385]}), E.TEXT_TOO_LONG),  # 32770 UTF-8 bytes
        (frames("infer", {"texts": ["a"] * 65}), E.TOO_MANY_TEXTS),
        (frames("infer", {"texts": ["a"], "priority": 3}), E.INVALID_OPTION),
        (frames("infer", {"texts": ["a"], "priority": -1}), E.INVALID_OPTION),
        (frames("infer", {"texts": ["a"], "priority": 1.0}), E.INVALID_FIELD),
        (frames("infer", {"texts": ["a"], "priority": True}), E.INVALID_FIELD),
        (frames("infer", {"texts": ["a"], "deadline_ms": 0}), E.INVALID_OPTION),
        (frames("infer", {"texts": ["a"], "deadline_ms": -5}), E.INVALID_OPTION),
        (frames("infer", {"texts": ["a"], "deadline_ms": 3_600_001}), E.INVALID_OPTION),
        (frames("infer", {"texts": ["a"], "deadline_ms": float("nan")}), E.INVALID_OPTION),
        (frames("infer", {"texts": ["a"], "deadline_ms": "10"}), E.INVALID_FIELD),
        (frames("infer", {"texts": ["a"], "truncate": 1}), E.INVALID_FIELD),
        (frames("infer", {"texts": ["a"], "request_id": ""}), E.INVALID_OPTION),
        (frames("infer", {"texts": ["a"], "request_id": "r" * 129}), E.INVALID_OPTION),
        (frames("infer", {"texts": ["a"], "request_id": -1}), E.INVALID_OPTION),
        (frames("infer", {"texts": ["a"], "request_id": 1.5}), E.INVALID_FIELD),
        (frames("infer", {"texts": ["a"], "request_id": [1]}), E.INVALID_FIELD),
        (frames("cancel", {}), E.INVALID_FIELD),
        (frames("cancel", {"request_id": None}), E.INVALID_FIELD),
        ([b'{"v":1,"type":"infer"}', b'{"texts":["\\ud800"]}'], E.INVALID_FIELD),  # lone surrogate
        ([b'{"v":1,"type":"infer"}', b"[" * 100_000], E.MALFORMED_FRAME),  # recursion
        ([frames("infer")[0], b"\x91" * 100_000], E.MALFORMED_FRAME),  # nesting too deep
    ],
)
def test_refusals_have_their_code(fr, code):
    assert code_of(fr) == code


def test_frame_too_large_checked_before_decoding():
    limits = P.Limits(max_frame_bytes=1024)
    assert code_of([b"\xc1" * 2000, b"\x80"], limits) == E.FRAME_TOO_LARGE
    assert code_of([frames("health")[0], b"\x80" * 1025], limits) == E.FRAME_TOO_LARGE


def test_error_carries_request_id_when_known():
    with pytest.raises(P.ProtocolError) as ei:
        parse_request(frames("infer", {"texts": [""], "request_id": "abc"}))
    assert ei.value.request_id == "abc" and ei.value.code == E.EMPTY_TEXT


def test_error_reply_bytes_and_decoding():
    fr = P.encode_error(E.OVERLOADED, "full", "00ff", P.MSGPACK, request_id=3)
    assert len(fr) == 2
    assert msgpack.unpackb(fr[0]) == {"v": 1, "type": "error"}
    assert msgpack.unpackb(fr[1]) == {"code": 2000, "name": "OVERLOADED", "message": "full", "trace_id": "00ff", "request_id": 3}
    r = P.decode_reply(fr)
    assert r.is_error and r.body["code"] == 2000 and r.extra == []
    fr = P.encode_error(E.EMPTY_TEXT, "empty", "01", P.JSON)
    assert json.loads(fr[1]) == {"code": 1005, "name": "EMPTY_TEXT", "message": "empty", "trace_id": "01"}


def test_embeddings_frame_is_little_endian_float32_row_major():
    emb = np.array([[1.0, -2.5, 0.0], [3.25, 1e-3, -0.0]], dtype=np.float32)
    raw = emb.astype("<f4").tobytes()
    assert raw[:4] == b"\x00\x00\x80\x3f"  # 1.0f little-endian
    assert len(raw) == 2 * 3 * 4
    back = P.embeddings_from_frame(raw, 2, 3)
    assert back.dtype == np.float32 and np.array_equal(back, emb)
    with pytest.raises(ValueError):
        P.embeddings_from_frame(raw, 3, 3)


def test_decode_reply_rejects_garbage():
    for bad in ([b"\x80"], [b"\xc1", b"\x80"], [P.encode_obj({"v": 2, "type": "x"}), b"\x80"]):
        with pytest.raises(ValueError):
            P.decode_reply(bad)


def test_public_names_of_edge_ipc():
    import edge.ipc

    assert edge.ipc.__all__ == ["IpcServer", "Lifecycle", "default_bind_address", "EdgeClient", "EmbedResult",
                                "default_address", "normalize_address", "AddressError"]
    for name in edge.ipc.__all__:
        assert getattr(edge.ipc, name).__name__ == name


_HEADER = '{"v":1,"type":"infer"}'
_BODY = '{"texts":["h\u00e9llo"]}'


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-32-le"])
def test_json_in_utf16_or_utf32_without_a_bom_is_refused_as_not_utf8(codec):
    """It starts with ``{`` (then NUL), so it is sniffed as JSON; json.loads would guess its encoding."""
    for fr in ([_HEADER.encode(codec), _BODY.encode(codec)], [_HEADER.encode(), _BODY.encode(codec)]):
        with pytest.raises(P.ProtocolError) as ei:
            parse_request(fr)
        assert ei.value.code == E.MALFORMED_FRAME and "JSON must be UTF-8" in ei.value.message, ei.value.message


@pytest.mark.parametrize("codec,bom", [("utf-16", "UTF-16"), ("utf-16-be", None), ("utf-32", "UTF-32"),
                                       ("utf-32-be", None), ("utf-8-sig", "UTF-8")])
def test_json_behind_a_bom_or_big_endian_is_sniffed_as_msgpack_and_refused(codec, bom):
    fr = [_HEADER.encode(codec), _BODY.encode(codec)]
    assert P.sniff_encoding(fr[0]) == P.MSGPACK
    with pytest.raises(P.ProtocolError) as ei:
        parse_request(fr)
    assert ei.value.code == E.MALFORMED_FRAME and ei.value.message.startswith("frame is not valid msgpack")
    if bom:  # the message says why
        assert f"starts with a {bom} byte order mark: JSON must be UTF-8" in ei.value.message, ei.value.message


@pytest.mark.parametrize("body", [b"\xef\xbb\xbf" + _BODY.encode(),  # a UTF-8 BOM before the body
                                  _BODY.encode("latin-1"),  # \xe9 alone is not UTF-8
                                  b'{"texts":["\xed\xa0\x80"]}',  # an encoded surrogate (json.loads took it)
                                  b'{"texts":["\xc3"]}'])  # truncated sequence
def test_json_body_that_is_not_strict_utf8_is_refused(body):
    with pytest.raises(P.ProtocolError) as ei:
        parse_request([_HEADER.encode(), body])
    assert ei.value.code == E.MALFORMED_FRAME and "JSON must be UTF-8" in ei.value.message, ei.value.message


def test_json_in_utf8_still_decodes():
    _, m = parse_request([_HEADER.encode(), _BODY.encode()])
    assert m.texts == ["h\u00e9llo"]
    assert P.decode_obj(memoryview(b'{"a":"\xe6\x97\xa5"}'), P.JSON) == {"a": "\u65e5"}
    with pytest.raises(P.ProtocolError, match="not valid json: JSONDecodeError"):  # plain syntax errors say so
        P.decode_obj(b'{"a":', P.JSON)
