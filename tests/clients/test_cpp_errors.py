"""The C++ client's error codes (clients/cpp/include/edge/errors.hpp) are edge/errors.py's.

The header is written by hand, for C++ readers; this test holds it equal to the Python enum,
names and numbers, both ways: its ``enum class ErrorCode`` and its ``error_name`` switch."""

from __future__ import annotations

import re
from pathlib import Path

from edge.errors import ErrorCode

HEADER = Path(__file__).resolve().parents[2] / "clients" / "cpp" / "include" / "edge" / "errors.hpp"


def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def _enum(text: str | None = None) -> dict[str, int]:
    text = _strip_comments(HEADER.read_text() if text is None else text)
    m = re.search(r"enum\s+class\s+ErrorCode\s*:\s*int\s*\{(.*?)\};", text, flags=re.S)
    assert m, f"no `enum class ErrorCode : int {{ ... }};` in {HEADER}"
    entries = [e.strip() for e in m.group(1).split(",") if e.strip()]
    out: dict[str, int] = {}
    for entry in entries:
        em = re.fullmatch(r"([A-Z][A-Z0-9_]*)\s*=\s*(\d+)", entry)
        assert em, f"errors.hpp: an enumerator without an explicit number: {entry!r}"
        assert em.group(1) not in out, f"errors.hpp: {em.group(1)} twice"
        out[em.group(1)] = int(em.group(2))
    return out


def _names() -> dict[str, str]:
    text = _strip_comments(HEADER.read_text())
    body = text.split("error_name(ErrorCode code)", 1)[1].split("return nullptr;", 1)[0]
    return dict(re.findall(r'case\s+ErrorCode::([A-Z0-9_]+)\s*:\s*return\s+"([^"]*)"\s*;', body))


def test_the_cpp_enum_is_the_python_enum():
    cpp = _enum()
    py = {c.name: int(c) for c in ErrorCode}
    assert sorted(set(py) - set(cpp)) == [], "codes of edge/errors.py missing from errors.hpp"
    assert sorted(set(cpp) - set(py)) == [], "codes of errors.hpp that edge/errors.py does not have"
    assert {n: (py[n], cpp[n]) for n in py if py[n] != cpp[n]} == {}, "names with other numbers (python, c++)"
    assert len(set(cpp.values())) == len(cpp), "a number used twice in errors.hpp"


def test_every_code_has_its_own_name():
    names = _names()
    assert set(names) == set(_enum()), "error_name() must have one case per enumerator"
    assert {k: v for k, v in names.items() if k != v} == {}, "error_name() returns another name"


def test_the_parser_sees_a_difference():
    """The regexes are not vacuous: a renumbered, a missing and an extra code are all seen."""
    assert _enum()["OVERLOADED"] == 2000 and len(_enum()) == len(ErrorCode) > 30
    text = HEADER.read_text()
    for mutated in (text.replace("OVERLOADED = 2000", "OVERLOADED = 2999"),
                    text.replace("    OVERLOADED = 2000,\n", ""),
                    text.replace("    OVERLOADED = 2000,\n", "    OVERLOADED = 2000,\n    SURPLUS = 2099,\n")):
        assert mutated != text
        assert _enum(mutated) != {c.name: int(c) for c in ErrorCode}
