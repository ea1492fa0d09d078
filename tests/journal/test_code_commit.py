"""``edge_commit``: from EDGE_CODE_COMMIT, edge/_build_info.json or the checkout's .git files,
without running git, in well under a millisecond."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from edge.system.version import code_commit, git_commit

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def _checkout(root: Path) -> Path:
    """``root/edge`` inside a checkout whose HEAD is on branch main."""
    (root / ".git" / "refs" / "heads").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "edge").mkdir()
    return root / "edge"


def test_the_variable_wins_then_build_info_then_git(tmp_path):
    package = _checkout(tmp_path)
    (tmp_path / ".git" / "refs" / "heads" / "main").write_text(SHA + "\n")
    assert code_commit({}, str(package)) == SHA
    (package / "_build_info.json").write_text('{"commit": "%s"}' % OTHER)
    assert code_commit({}, str(package)) == OTHER
    assert code_commit({"EDGE_CODE_COMMIT": "v1-abc "}, str(package)) == "v1-abc"
    (package / "_build_info.json").write_text("not json")
    assert code_commit({}, str(package)) == SHA


def test_packed_refs_a_detached_head_and_no_git(tmp_path):
    package = _checkout(tmp_path)
    (tmp_path / ".git" / "packed-refs").write_text(f"# pack-refs with: peeled\n{OTHER} refs/heads/other\n"
                                                   f"{SHA} refs/heads/main\n")
    assert code_commit({}, str(package)) == SHA
    (tmp_path / ".git" / "HEAD").write_text(OTHER + "\n")
    assert git_commit(str(tmp_path)) == OTHER
    shutil.rmtree(tmp_path / ".git")
    assert code_commit({}, str(package)) is None


def test_a_worktree_follows_its_gitdir_and_commondir(tmp_path):
    main = tmp_path / "main"
    (main / ".git" / "refs" / "heads").mkdir(parents=True)
    (main / ".git" / "refs" / "heads" / "feature").write_text(SHA + "\n")
    wt_git = main / ".git" / "worktrees" / "wt"
    wt_git.mkdir(parents=True)
    (wt_git / "HEAD").write_text("ref: refs/heads/feature\n")
    (wt_git / "commondir").write_text("../..\n")
    wt = tmp_path / "wt"
    (wt / "edge").mkdir(parents=True)
    (wt / ".git").write_text(f"gitdir: {wt_git}\n")
    assert code_commit({}, str(wt / "edge")) == SHA


def test_this_checkout_cheaply():
    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    expected = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    start = time.perf_counter()
    got = code_commit({})
    elapsed = time.perf_counter() - start
    assert got == expected and elapsed < 0.005, (got, elapsed)
