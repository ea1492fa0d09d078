"""The schema, its generated reader code and the Unicode overrides stay reproducible."""

from __future__ import annotations

import shutil
import tempfile
import unicodedata
from pathlib import Path

import pytest

from edge.errors import ErrorCode, TokenizerError
from image.tokenizer import schema, unicode_ref


@pytest.mark.skipif(shutil.which("flatc") is None, reason="flatc (Debian flatbuffers-compiler) is not installed")
def test_generated_reader_is_up_to_date():
    with tempfile.TemporaryDirectory() as tmp:
        generated = schema.generate(Path(tmp))
        assert sorted(p.name for p in generated[0].glob("*.py"))  # flatc produced something
        assert (generated[1] / "Tokenizer.py").exists()  # and the builder half was split off
        assert schema.differences(generated) == []


def test_the_device_reader_holds_no_builder_functions():
    """The runtime maps and reads tokenizer files; only the build host writes them."""
    for path in schema.PACKAGE.glob("*.py"):
        assert not any(line.startswith("def ") for line in path.read_text().splitlines()), path.name


def test_schema_names_the_reader_package():
    text = schema.SCHEMA.read_text()
    assert "namespace edge.preload.tokenizer_fb;" in text
    assert 'file_identifier "EDTK";' in text


def test_overrides_match_this_python():
    meta = unicode_ref.overrides_meta()
    assert meta["unidata_version"] == unicodedata.unidata_version


def test_compiler_refuses_other_unicode_versions(monkeypatch):
    unicode_ref.overrides.cache_clear()
    monkeypatch.setattr(unicode_ref.unicodedata, "unidata_version", "0.0.0")
    try:
        with pytest.raises(TokenizerError) as err:
            unicode_ref.overrides()
        assert err.value.code == ErrorCode.TOKENIZER_UNSUPPORTED
        assert "--regenerate" in str(err.value)
    finally:
        monkeypatch.undo()
        unicode_ref.overrides.cache_clear()
