"""BatchShapes: the one rule for buckets, rows, warmed shapes and padding."""

import pytest

from edge.serving.shapes import BatchShapes
from edge.preload.serving_settings import ServingSettings

BUCKETS = [16, 32, 64, 128, 256]


def shapes(kind="cpu", max_seq_length=None, **kw) -> BatchShapes:
    return BatchShapes(ServingSettings(buckets=BUCKETS, **kw), max_seq_length=max_seq_length, kind=kind)


def test_bucket_for_is_smallest_that_fits():
    s = shapes()
    assert [s.bucket_for(n) for n in (1, 16, 17, 32, 33, 255, 256)] == [16, 16, 32, 32, 64, 256, 256]
    assert s.bucket_for(257) is None


def test_rows_bounded_by_batch_size_and_batch_tokens_never_zero():
    s = shapes(max_batch_size=32, max_batch_tokens=4096)
    assert {b: s.rows(b) for b in BUCKETS} == {16: 32, 32: 32, 64: 32, 128: 32, 256: 16}
    one = BatchShapes(ServingSettings(buckets=[512], max_batch_size=4, max_batch_tokens=100))
    assert one.rows(512) == 1


def test_max_text_tokens_is_the_smaller_of_model_and_largest_bucket():
    assert shapes(max_seq_length=128).max_text_tokens == 128
    assert shapes(max_seq_length=512).max_text_tokens == 256
    assert shapes().max_text_tokens == 256


def test_cpu_warms_one_row_per_bucket_largest_first():
    s = shapes("cpu")
    assert s.warm_shapes() == [(1, 256), (1, 128), (1, 64), (1, 32), (1, 16)] and s.warm_repeats == 1


def test_cuda_warms_every_batch_size_that_fits_and_pads_up_to_one():
    s = shapes("cuda", batch_sizes=[1, 2, 4, 8, 16, 32], max_batch_tokens=4096)
    expected = {(b, t) for t in BUCKETS for b in (1, 2, 4, 8, 16, 32) if b * t <= 4096}
    assert set(s.warm_shapes()) == expected and s.warm_repeats == 3
    first = s.warm_shapes()[0]
    assert first[0] * first[1] == 4096
    # padded up to a warmed size within the bucket's rows; past the last one, as is
    assert [s.padded_rows(n, 16) for n in (1, 3, 5, 17, 32)] == [1, 4, 8, 32, 32]
    assert s.padded_rows(9, 256) == 16  # 256 holds 16 rows: 16 is warmed
    assert [shapes("cpu", batch_sizes=[1, 4]).padded_rows(n, 16) for n in (1, 3)] == [1, 3]  # a CPU never pads


def test_package_warm_settings_override_the_defaults_per_kind():
    s = shapes("cpu", warm={"cpu": {"batch_sizes": [1, 4], "repeats": 2}})
    assert (4, 256) in s.warm_shapes() and s.warm_repeats == 2
    assert shapes("cuda", warm={"cpu": {"repeats": 5}}).warm_repeats == 3  # the other kind keeps its default


def test_warm_settings_are_validated():
    from edge.preload.schema import Invalid

    with pytest.raises(Invalid, match="serving.warm.tpu"):
        ServingSettings.model_validate({"warm": {"tpu": {"repeats": 1}}})
    with pytest.raises(Invalid, match="serving.warm.cpu.repeats"):
        ServingSettings.model_validate({"warm": {"cpu": {"repeats": 0}}})


def test_width_is_the_bucket_on_cuda_and_the_longest_text_on_a_cpu():
    cpu, cuda = shapes("cpu"), shapes("cuda")
    assert not cpu.pads_to_bucket and cuda.pads_to_bucket
    assert [cpu.width(32, n) for n in (17, 20, 32)] == [17, 20, 32]
    assert cpu.width(32, 40) == 32 and cpu.width(16, 0) == 1  # never over the bucket, never empty
    assert [cuda.width(32, n) for n in (17, 32)] == [32, 32]
