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


def _brute_cost(lengths, groups, call_cost):
    return sum(len(g) * max(lengths[i] for i in g) + call_cost for g in groups)


def test_a_cpu_batch_is_cut_into_calls_only_where_the_padding_saved_pays_for_a_call():
    from itertools import combinations

    from edge.serving.shapes import CALL_COST_TOKENS

    cpu = shapes("cpu")
    assert cpu.groups([40]) == [[0]] and cpu.groups([]) == [[]]
    assert cpu.groups([20, 21, 22, 23]) == [[0, 1, 2, 3]]  # cutting saves less than a call
    mixed = [34] * 30 + [64]  # one long text would make thirty run 64 wide
    runs = cpu.groups(mixed)
    assert runs == [list(range(30)), [30]]
    assert sorted(i for r in runs for i in r) == list(range(len(mixed)))
    # optimal: no split of the sorted texts into runs costs less (every cut set, 8 texts)
    lengths = [17, 60, 18, 33, 61, 19, 40, 64]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    best = min(_brute_cost(lengths, [order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)))], CALL_COST_TOKENS)
               for k in range(len(order)) for cuts in combinations(range(1, len(order)), k))
    assert _brute_cost(lengths, cpu.groups(lengths), CALL_COST_TOKENS) == best


def test_a_dearer_call_cuts_less():
    cpu = shapes("cpu")
    lengths = [10] * 4 + [30] * 4  # a cut saves 4 x 20 = 80 padded tokens
    assert cpu.groups(lengths, 8.0) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cpu.groups(lengths, 100.0) == [list(range(8))]


def test_cuda_runs_a_batch_in_one_call_in_its_order():
    assert shapes("cuda").groups([34, 64, 20]) == [[0, 1, 2]]
