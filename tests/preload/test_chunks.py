"""A package file checked by chunks (edge/preload/chunks.py, ContentCheck in edge/preload/manifest.py):
the digests are sha256 over each slice, threads share the chunks without hashing one twice, the
first bad chunk is reported, and the real package's large files are checked so."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from edge.errors import ErrorCode, PackageError
from edge.preload import chunks
from edge.preload.manifest import open_package
from support.packages import clone, flip_byte, rewrite_manifest

SMALL = 4096  # a chunk size for synthetic files: many chunks from a few KiB


@pytest.mark.parametrize("size", [0, 1, SMALL - 1, SMALL, SMALL + 1, 5 * SMALL, 5 * SMALL + 7])
def test_each_digest_is_the_sha256_of_its_slice(tmp_path, size):
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    got = chunks.chunk_digests(tmp_path / "f", SMALL)
    want = [hashlib.sha256(data[o:o + SMALL]).hexdigest() for o in range(0, size, SMALL)] or [hashlib.sha256(b"").hexdigest()]
    assert got == want and len(got) == chunks.chunk_count(size, SMALL)


def _files(tmp_path, sizes: list[int]) -> list[tuple[str, object, list[str]]]:
    out = []
    for i, size in enumerate(sizes):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(size))
        out.append((p.name, p, chunks.chunk_digests(p, SMALL)))
    return out


def test_threads_share_the_chunks_and_hash_each_once(tmp_path):
    files = _files(tmp_path, [64 * SMALL + 3, 0, 40 * SMALL])
    check = chunks.ChunkedHash(files, SMALL)
    counts: list[int] = []
    start = threading.Barrier(4)

    def helper():
        start.wait()
        counts.append(check.help())

    threads = [threading.Thread(target=helper, name=f"helper-{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert check.wait() is None
    assert sum(counts) == sum(len(d) for _, _, d in files)  # every chunk hashed, none twice
    assert check.threads <= {f"helper-{i}" for i in range(4)} and check.threads


def test_the_first_bad_chunk_is_reported_and_hashing_stops(tmp_path):
    files = _files(tmp_path, [30 * SMALL, 30 * SMALL])
    for _, _, digests in files:
        digests[20] = "0" * 64  # two bad chunks in each file
        digests[25] = "0" * 64
    check = chunks.ChunkedHash(files, SMALL)
    assert check.wait() == ("f0", 20)
    assert check.help() == 0  # nothing more is handed out after a mismatch


def test_a_stopped_check_hands_out_nothing(tmp_path):
    check = chunks.ChunkedHash(_files(tmp_path, [10 * SMALL]), SMALL)
    check.stop()
    assert check.help() == 0 and check.wait() is None and not check.threads


def test_a_missing_file_raises_at_once(tmp_path):
    files = _files(tmp_path, [SMALL])
    with pytest.raises(FileNotFoundError):
        chunks.ChunkedHash([*files, ("gone", tmp_path / "gone", ["0" * 64])], SMALL)


# ------------------------------------------------------------------ the real package


def test_the_real_package_has_the_chunks_of_its_large_files(minilm_package):
    m = open_package(minilm_package, verify="none").manifest
    table = m.sha256_chunks
    assert table["chunk_size"] == chunks.CHUNK_SIZE
    large = {n for n, e in m.files.items() if e.size > chunks.CHUNK_SIZE}
    assert set(table["digests"]) == large and "model.ort" in large
    assert table["digests"]["model.ort"] == chunks.chunk_digests(minilm_package / "model.ort")


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flipped_byte_is_refused_by_its_chunk_with_helpers(minilm_package, tmp_path, where):
    root = clone(minilm_package, tmp_path / "pkg", copy=("model.ort",))
    size = (root / "model.ort").stat().st_size
    offset = {"first": 0, "middle": size // 2, "last": size - 1}[where]
    flip_byte(root / "model.ort", offset)
    check = open_package(root, verify="size").content_check(["model.ort"])
    helpers = [threading.Thread(target=check.help) for _ in range(2)]
    for t in helpers:
        t.start()
    with pytest.raises(PackageError) as info:
        check.run()
    for t in helpers:
        t.join()
    k = offset // chunks.CHUNK_SIZE
    assert info.value.code == ErrorCode.PACKAGE_HASH_MISMATCH and info.value.file == "model.ort"
    assert f"chunk {k} (from byte {k * chunks.CHUNK_SIZE})" in str(info.value)


def test_a_good_file_passes_with_helpers_and_counts_them(minilm_package):
    check = open_package(minilm_package, verify="none").content_check(["model.ort", "tokenizer.fb"])
    helper = threading.Thread(target=check.help)
    helper.start()
    assert check.run() == {"model.ort": "sha256", "tokenizer.fb": "sha256"}
    helper.join()
    assert 1 <= check.threads <= 2


def test_a_helper_of_a_check_that_failed_early_returns(minilm_package, tmp_path):
    root = clone(minilm_package, tmp_path / "pkg")
    (root / "model.ort").unlink()
    check = open_package(root, verify="none").content_check(["model.ort"])
    with pytest.raises(PackageError) as info:
        check.run()
    assert info.value.code == ErrorCode.PACKAGE_FILE_MISSING
    check.help()  # returns: the run that would share chunks has ended


def test_a_helper_of_a_check_never_run_returns_once_told(minilm_package):
    check = open_package(minilm_package, verify="none").content_check(["model.ort"])
    ended = threading.Event()
    threading.Timer(0.05, ended.set).start()
    check.help(ended)  # returns once ended is set, without the run


def test_a_package_without_chunks_is_hashed_whole(minilm_package, tmp_path):
    root = clone(minilm_package, tmp_path / "pkg", copy=("model.ort",))
    rewrite_manifest(root, lambda d: d.pop("sha256_chunks"))
    check = open_package(root, verify="none").content_check(["model.ort"])
    assert check.run() == {"model.ort": "sha256"} and check.threads == 0
    flip_byte(root / "model.ort", 100)
    with pytest.raises(PackageError) as info:
        open_package(root, verify="none").verify_files(["model.ort"])
    assert info.value.code == ErrorCode.PACKAGE_HASH_MISMATCH and "sha256" in str(info.value)


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["sha256_chunks"]["digests"]["model.ort"].pop(), "sha256_chunks.digests.model.ort"),
    (lambda d: d["sha256_chunks"]["digests"].update({"nope.bin": ["0" * 64]}), "sha256_chunks.digests.nope.bin"),
    (lambda d: d["sha256_chunks"].update({"algorithm": "md5"}), "sha256_chunks.algorithm"),
    (lambda d: d["sha256_chunks"].update({"chunk_size": 100}), "sha256_chunks.chunk_size"),
    (lambda d: d["sha256_chunks"]["digests"]["model.ort"].__setitem__(0, "zz"), "sha256_chunks.digests.model.ort.0"),
])
def test_a_malformed_chunk_table_is_package_invalid(minilm_package, tmp_path, edit, where):
    root = clone(minilm_package, tmp_path / "pkg")
    rewrite_manifest(root, edit)
    with pytest.raises(PackageError) as info:
        open_package(root, verify="none")
    assert info.value.code == ErrorCode.PACKAGE_INVALID and where in str(info.value)
