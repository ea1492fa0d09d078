"""The engine's chain (edge/runtime/engine_chain.py) with a fake package and engine: the engine loads
and warms before its files' hash has ended, the hash is taken by the first thread free, and a failed
hash is the boot's error whatever the engine did."""

from __future__ import annotations

import os
import threading
import time
import types

import pytest

import edge.engines
from edge.errors import BootError, EngineError, ErrorCode, PackageError
from edge.preload import chunks
from edge.preload.manifest import open_package
from edge.preload.serving_settings import ServingSettings
from edge.runtime import engine_chain
from edge.runtime.engine_chain import EngineChain, engine_options, warm_plan
from edge.runtime.stages import Handoff, Stages
from edge.runtime.timeline import Timeline
from edge.serving.shapes import BatchShapes
from support.packages import flip_byte, rewrite_manifest, write_small_package

HASH_WAIT_S = 10.0  # the fake hash waits at most this long for its go


class FakeEngine:
    name = "onnxruntime"
    device = "cpu"

    def __init__(self) -> None:
        self.runs = 0
        self.closed = False

    def warm_run(self, batch: int, tokens: int, ids: list[int]) -> bool:
        self.runs += 1
        return True

    def close(self) -> None:
        self.closed = True


class FakePackage:
    """``verify_files`` waits for ``go`` (the test decides when the hash ends), then fails or passes."""

    def __init__(self, bad: bool) -> None:
        self.bad = bad
        self.go = threading.Event()
        self.hashed: list[list[str]] = []
        self.hashed_on: list[str] = []  # the thread that hashed
        serving = ServingSettings.model_validate({"buckets": [16, 32], "warm_sample_ids": [101, 7, 102]})
        self.manifest = types.SimpleNamespace(serving=serving, max_seq_length=32)

    def engine_files(self, engine: str, device: str = "cpu") -> list[str]:
        return ["model.ort"]

    def content_check(self, names):
        """What the chain runs: ``verify_files`` on the thread that takes the job; no chunks to share."""
        return types.SimpleNamespace(run=lambda: self.verify_files(names), help=lambda ended=None: None, threads=0)

    def verify_files(self, names) -> None:
        self.hashed_on.append(threading.current_thread().name)
        assert self.go.wait(HASH_WAIT_S)
        self.hashed.append(list(names))
        if self.bad:
            raise PackageError("model.ort: sha256 differs (tampered)", ErrorCode.PACKAGE_HASH_MISMATCH, file="model.ort")


def _chain(monkeypatch, pkg: FakePackage, load, verify: str = "full", spare_cpus: int = 0, **flags):
    """``spare_cpus``: the hashing threads started beside the chain (0 on the 2-core machine these
    tests assume, whatever machine runs them)."""
    monkeypatch.setattr(engine_chain, "spare_cpus", lambda: spare_cpus)
    library = types.SimpleNamespace(available_providers=lambda: ["CPUExecutionProvider"])
    monkeypatch.setattr(edge.engines, "import_engine", lambda name: library)
    monkeypatch.setattr(edge.engines, "load_engine", load)
    args = types.SimpleNamespace(engine="onnxruntime", device="cpu", verify=verify, cuda_reserve_mb=0,
                                 ort_prepacking="auto", snapshot_point=False)
    vars(args).update(flags)
    timeline = Timeline(exec_s=0.0)
    chain = EngineChain(Stages(timeline), args, Handoff())
    chain.open(pkg)
    return chain, timeline


def _stages(timeline: Timeline) -> dict[str, dict]:
    return {s["stage"]: s for s in timeline.as_dict()["stages"]}


def _until(check, what: str) -> None:
    deadline = time.monotonic() + HASH_WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)  # poll interval (s)


def test_the_engine_loads_and_warms_while_its_files_are_hashed(monkeypatch):
    pkg = FakePackage(bad=False)
    engine = FakeEngine()

    def load_engine(p, name, device, **options):
        assert not pkg.hashed  # the hash has not ended: the load did not wait for it
        return engine

    chain, timeline = _chain(monkeypatch, pkg, load_engine)
    # the engine's stages all end with the hash still waiting: its thread has taken it, nothing else was free
    _until(lambda: engine.runs == 2 and pkg.hashed_on, "the engine warmed, then took the hash")
    assert pkg.hashed_on == ["boot-engine"] and not pkg.hashed
    pkg.go.set()
    assert chain.result()[0] is engine
    assert pkg.hashed == [["model.ort"]]
    stages = _stages(timeline)
    assert stages["preallocate"]["end_ms"] <= stages["verify_package"]["start_ms"]
    assert stages["verify_package"]["overlapped"] is True


def test_the_main_thread_takes_the_hash_once_its_own_stages_are_done(monkeypatch):
    pkg = FakePackage(bad=False)
    engine = FakeEngine()
    loading = threading.Event()

    def load_engine(p, name, device, **options):
        loading.set()
        assert pkg.go.wait(HASH_WAIT_S)  # the load goes on until the hash (on the main thread) is under way
        return engine

    chain, _ = _chain(monkeypatch, pkg, load_engine)
    assert loading.wait(HASH_WAIT_S)
    threading.Timer(0.05, pkg.go.set).start()
    chain.verify_here()  # what boot does after prepare_tokenizer
    assert pkg.hashed_on == [threading.current_thread().name] and pkg.hashed == [["model.ort"]]
    assert chain.result()[0] is engine and engine.runs == 2
    assert pkg.hashed_on == [threading.current_thread().name]  # the engine's thread found it taken


def test_with_spare_cpus_a_helper_hashes_from_the_start(monkeypatch):
    pkg = FakePackage(bad=False)
    engine = FakeEngine()

    def load_engine(p, name, device, **options):
        _until(lambda: pkg.hashed_on, "a helper took the hash while the engine loads")
        return engine

    chain, timeline = _chain(monkeypatch, pkg, load_engine, spare_cpus=2)
    pkg.go.set()
    assert chain.result()[0] is engine and engine.runs == 2
    assert pkg.hashed_on == ["boot-verify-helper"] and pkg.hashed == [["model.ort"]]  # one took it, once
    stages = _stages(timeline)
    assert stages["verify_package"]["start_ms"] <= stages["load_engine"]["end_ms"]


@pytest.mark.parametrize("cpus, spare", [(1, 0), (2, 0), (3, 1), (4, 2), (6, 3), (12, 3)])
def test_spare_cpus_leave_two_to_the_boots_own_threads(monkeypatch, cpus, spare):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert engine_chain.spare_cpus() == spare


@pytest.mark.parametrize("spare", [0, 2])
def test_the_boots_threads_share_a_chunked_hash(monkeypatch, tmp_path, spare):
    """A real package with chunk digests: whichever threads hash (with ``spare`` helper threads
    from the start, as on a device of 2 + spare CPUs), every chunk matches and the stage says how
    many threads took part; a flipped byte is refused, naming its chunk."""
    root = tmp_path / "pkg"
    files = {"model.ort": bytes(range(256)) * (3 * chunks.CHUNK_SIZE // 256 + 17), "tokenizer.fb": b"tok"}
    write_small_package(root, files, serving={"buckets": [16], "warm_sample_ids": [1, 2]})
    rewrite_manifest(root, lambda d: d.update(sha256_chunks=chunks.manifest_section(root, list(files))))
    assert len(open_package(root, verify="none").manifest.sha256_chunks["digests"]["model.ort"]) == 4
    for bad in (False, True):
        if bad:
            flip_byte(root / "model.ort", 2 * chunks.CHUNK_SIZE + 5)
        engine = FakeEngine()
        chain, timeline = _chain(monkeypatch, open_package(root, verify="none"), lambda p, n, d, e=engine, **o: e,
                                 spare_cpus=spare)
        chain.verify_here()  # the main thread: takes the hash, or helps the engine's thread with it
        if bad:
            with pytest.raises(BootError) as err:
                chain.result()
            assert err.value.code == ErrorCode.PACKAGE_HASH_MISMATCH and "chunk 2 " in str(err.value)
        else:
            assert chain.result()[0] is engine
            entry = _stages(timeline)["verify_package"]
            assert entry["verified_by"] == {"model.ort": "sha256"} and 1 <= entry["threads"] <= 2 + spare
        _until(lambda: not any(t.name == "boot-verify-helper" for t in threading.enumerate()), "the helpers ended")


def test_a_failed_hash_is_the_error_even_after_the_engine_warmed(monkeypatch):
    pkg = FakePackage(bad=True)
    engine = FakeEngine()
    chain, _ = _chain(monkeypatch, pkg, lambda p, name, device, **options: engine)
    _until(lambda: engine.runs == 2 and pkg.hashed_on, "the engine warmed, then took the hash")
    pkg.go.set()
    with pytest.raises(BootError) as err:
        chain.result()
    assert err.value.stage == "verify_package" and err.value.code == ErrorCode.PACKAGE_HASH_MISMATCH
    assert "model.ort" in str(err.value)


def test_a_failed_hash_wins_over_the_engine_refusing_the_same_file(monkeypatch):
    pkg = FakePackage(bad=True)

    def load_engine(p, name, device, **options):
        raise EngineError("ONNX Runtime refused model.ort", ErrorCode.ENGINE_LOAD_FAILED, stage="load_engine")

    chain, _ = _chain(monkeypatch, pkg, load_engine)
    chain._task.join(HASH_WAIT_S)  # the engine failed: its thread took no hash
    assert not pkg.hashed_on
    pkg.go.set()
    with pytest.raises(BootError) as err:
        chain.result()  # the main thread hashes, and reports the hash's failure
    assert err.value.stage == "verify_package", err.value


def test_the_chain_stops_before_its_next_stage_once_a_hash_failed(monkeypatch):
    pkg = FakePackage(bad=True)
    loaded = threading.Event()
    engine = FakeEngine()

    started = threading.Event()

    def load_engine(p, name, device, **options):
        assert started.wait(HASH_WAIT_S)
        pkg.go.set()
        threading.Thread(target=chain.verify_here).start()  # the main thread's hash fails while the engine loads
        with pytest.raises(BootError):
            chain._verifies[0].result(HASH_WAIT_S)  # it ends, its error recorded
        loaded.set()
        return engine

    chain, timeline = _chain(monkeypatch, pkg, load_engine)
    started.set()
    with pytest.raises(BootError) as err:
        chain.result()
    assert err.value.stage == "verify_package"
    assert loaded.is_set() and engine.runs == 0  # no warm-up on a file known to be bad
    assert "warm_buckets" not in _stages(timeline)


def test_a_package_that_never_comes_ends_the_chain(monkeypatch):
    """The main thread failed before the package was open (open_package, select_engine): cancel()."""
    monkeypatch.setattr(edge.engines, "import_engine", lambda name: types.SimpleNamespace())
    args = types.SimpleNamespace(engine="onnxruntime", device="cpu", verify="full", cuda_reserve_mb=0)
    chain = EngineChain(Stages(Timeline(exec_s=0.0)), args, Handoff())
    chain.cancel()
    chain.settle(HASH_WAIT_S)
    assert not chain._task.is_alive() and chain.engine is None and not chain._verifies


def test_after_a_main_thread_failure_nothing_is_hashed(monkeypatch):
    pkg = FakePackage(bad=False)
    gate = threading.Event()

    def load_engine(p, name, device, **options):
        assert gate.wait(HASH_WAIT_S)
        return FakeEngine()

    chain, _ = _chain(monkeypatch, pkg, load_engine)
    chain.cancel()  # what boot does when a main-thread stage fails
    threading.Timer(0.05, gate.set).start()
    chain.settle(HASH_WAIT_S)
    assert not pkg.hashed_on and not chain._task.is_alive()


def test_verify_size_hashes_nothing(monkeypatch):
    pkg = FakePackage(bad=True)
    engine = FakeEngine()
    chain, timeline = _chain(monkeypatch, pkg, lambda p, name, device, **options: engine, verify="size")
    assert chain.result()[0] is engine
    assert not pkg.hashed and "verify_package" not in _stages(timeline)


@pytest.mark.parametrize("engine, device, choice, snapshot_point, prepacking", [
    ("onnxruntime", "cpu", "auto", True, True),  # paid once, when the snapshot is taken
    ("onnxruntime", "cpu", "auto", False, False),  # a fresh boot does not pay it on its critical path
    ("onnxruntime", "cpu", "on", False, True),
    ("onnxruntime", "cpu", "off", True, False),
    ("onnxruntime", "cuda:0", "on", True, None),  # a GPU session packs nothing for the CPU
    ("torchscript", "cpu", "on", True, None),
])
def test_ort_prepacking_follows_the_flag_and_the_snapshot_point(engine, device, choice, snapshot_point, prepacking):
    args = types.SimpleNamespace(engine=engine, ort_prepacking=choice, snapshot_point=snapshot_point)
    assert engine_options(args, device) == ({} if prepacking is None else {"prepacking": prepacking})


def test_the_load_stage_passes_and_records_the_engine_options(monkeypatch):
    pkg = FakePackage(bad=False)
    pkg.go.set()
    engine = FakeEngine()
    seen = []

    def load_engine(p, name, device, **options):
        seen.append(options)
        return engine

    chain, timeline = _chain(monkeypatch, pkg, load_engine, snapshot_point=True)
    assert chain.result()[0] is engine
    assert seen == [{"prepacking": True}]
    assert _stages(timeline)["load_engine"]["prepacking"] is True


SHAPES = [(1, 256), (1, 128), (1, 64), (1, 32), (1, 16)]  # a CPU's plan: batch 1 at every bucket, largest first


@pytest.mark.parametrize("kind, choice, snapshot_point, deferred", [
    ("cpu", "auto", False, True),  # a fresh CPU boot: the rest after READY
    ("cpu", "auto", True, False),  # the snapshot's boot pays every shape once, before the checkpoint
    ("cpu", "deferred", True, True),
    ("cpu", "full", False, False),
    ("cuda", "auto", False, False),  # graphs and TensorRT profiles exist only for warmed shapes
    ("cuda", "deferred", False, False),
])
def test_the_warm_plan_defers_only_on_a_cpu(kind, choice, snapshot_point, deferred):
    settings = ServingSettings.model_validate({"warm": {"cuda": {"batch_sizes": [1]}}})
    shapes = BatchShapes(settings, max_seq_length=256, kind=kind)
    assert shapes.warm_shapes() == SHAPES
    now, later = warm_plan(types.SimpleNamespace(warm_up=choice, snapshot_point=snapshot_point), shapes)
    if deferred:  # the smallest before READY; the rest smallest first, so a request waits the least
        assert now == [(1, 16)] and later == [(1, 32), (1, 64), (1, 128), (1, 256)]
    else:
        assert now == SHAPES and later == []


def test_the_warm_up_stage_records_what_it_left_for_after_ready(monkeypatch):
    pkg = FakePackage(bad=False)
    pkg.go.set()
    engine = FakeEngine()
    chain, timeline = _chain(monkeypatch, pkg, lambda p, name, device, **options: engine, warm_up="auto")
    chain.result()
    stage = _stages(timeline)["warm_buckets"]
    assert stage["shapes"] == 1 and stage["deferred"] == ["1x32"] and engine.runs == 1
    assert list(chain.warm["fastest_ms"]) == ["1x16"] and chain.warm_later == [(1, 32)]


@pytest.mark.parametrize("primary, fallback, snapshot_point, deferred", [
    ("cpu", "cpu", False, True),
    ("cpu", "cpu", True, True),  # loaded after each restore, never in the snapshot: deferred there too
    ("cuda", "cpu", True, True),  # a CPU fallback beside a CUDA primary (the primary's shapes)
    ("cpu", "cuda:0", False, False),  # a CUDA fallback warms every shape before READY
])
def test_the_fallbacks_warm_plan_is_its_own_devices_and_never_the_snapshots(primary, fallback, snapshot_point, deferred):
    from edge.runtime.fallback import _warm_plan

    settings = ServingSettings.model_validate({"warm": {"cuda": {"batch_sizes": [1]}}})
    shapes = BatchShapes(settings, max_seq_length=256, kind=primary)
    args = types.SimpleNamespace(warm_up="auto", snapshot_point=snapshot_point)
    now, later = _warm_plan(args, shapes, types.SimpleNamespace(device=fallback))
    if deferred:
        assert now == [(1, 16)] and later == [(1, 32), (1, 64), (1, 128), (1, 256)]
    else:
        assert now == SHAPES and later == []
    assert _warm_plan(types.SimpleNamespace(warm_up="full", snapshot_point=False), shapes,
                      types.SimpleNamespace(device=fallback)) == (SHAPES, [])
