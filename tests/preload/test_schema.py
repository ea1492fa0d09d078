import pytest

from edge.preload.serving_settings import ServingSettings as Serving
from edge.preload.schema import Invalid, dict_of, integer, one_of, sha256_hex


def test_checkers_name_the_failing_path():
    with pytest.raises(Invalid) as info:
        integer("3", "serving.max_batch_size")
    assert info.value.where == "serving.max_batch_size" and "integer" in info.value.reason
    with pytest.raises(Invalid, match="must be >= 1"):
        integer(0, "x", ge=1)
    with pytest.raises(Invalid):
        integer(True, "x")  # a JSON true is not a count
    with pytest.raises(Invalid):
        one_of(1, (True, False), "normalize")
    with pytest.raises(Invalid):
        sha256_hex("ABC", "model_sha256")
    with pytest.raises(Invalid) as info:
        dict_of({"sha256": "x"}, "files.a", keys={"sha256", "size"})
    assert info.value.where == "files.a.size"


def test_serving_keeps_unknown_settings_and_defaults():
    s = Serving.model_validate({"buckets": [8, 16], "warm": {"cpu": {"repeats": 2}}})
    dumped = s.model_dump()
    assert dumped["buckets"] == [8, 16] and dumped["max_batch_size"] == 32
    assert dumped["warm"] == {"cpu": {"repeats": 2}}


@pytest.mark.parametrize("buckets", [[], [16, 16], [32, 16], [0, 16], "16"])
def test_serving_refuses_bad_buckets(buckets):
    with pytest.raises(Invalid) as info:
        Serving.model_validate({"buckets": buckets})
    assert info.value.where.startswith("serving.buckets")
