"""Admission with the real MiniLM tokenizer: what it refuses before anything is queued."""

import pytest

from edge.errors import ErrorCode, RequestError
from edge.preload.manifest import open_package
from edge.preload.tokenizer import load_tokenizer
from edge.serving.admission import Admission
from edge.serving.shapes import BatchShapes


@pytest.fixture(scope="module")
def admission(minilm_package):
    pkg = open_package(minilm_package, verify="size")
    shapes = BatchShapes(pkg.manifest.serving, max_seq_length=pkg.manifest.max_seq_length)
    return Admission(load_tokenizer(pkg.path(pkg.manifest.tokenizer)), shapes)


@pytest.mark.parametrize("text", ["\u200b\u200b", "\x00\x01\x02", "\u0301\u0301", "\U000e0041\U000e0042",
                                  "\u200b \x00 \u0301"])
def test_a_text_of_only_invisible_characters_is_empty(admission, text):
    with pytest.raises(RequestError) as info:
        admission.tokenize(["fine", text], truncate=True, arrival=0.0)
    assert info.value.code == ErrorCode.EMPTY_TEXT and "texts[1]" in info.value.message


def test_a_text_with_one_visible_character_is_embedded(admission):
    request = admission.tokenize(["\u200bA\u200b"], truncate=True, arrival=0.0)
    assert request.tokens == [3] and request.buckets == [16]  # [CLS] a [SEP]
