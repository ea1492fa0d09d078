"""The build host's commands meet a user's mistakes without a traceback.

Each mistake runs the real command as a subprocess and checks three things: the exit status
(0 ok, 1 a verdict, 2 usage or unusable input, 3 the job failed, 130 Ctrl-C, 143 SIGTERM),
a message that names the fix, and no "Traceback" on stderr or stdout. The interrupt tests
send SIGINT/SIGTERM in the middle of a long step and check that nothing half-written is left
beside the output and that no child process outlives the command.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from image.bundle.progress import descendants

TIMEOUT_S = 60  # for any one command; each of these mistakes is refused in well under a second


def _run(module: str, *args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], input=stdin, capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=cwd)


def _refused(r: subprocess.CompletedProcess, code: int, fix: str) -> None:
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    assert r.returncode == code, (r.returncode, r.stderr)
    assert fix in r.stderr, r.stderr


@pytest.fixture(scope="module")
def tokenizer_fb(minilm_json, tmp_path_factory) -> Path:
    from image.tokenizer.compile import compile_tokenizer_json

    path = tmp_path_factory.mktemp("tok") / "tokenizer.fb"
    path.write_bytes(compile_tokenizer_json(minilm_json))
    return path


# ----------------------------------------------------------------------------- edge-bundle


def test_bundle_verify_of_a_missing_directory_names_the_command_that_makes_one(tmp_path):
    r = _run("image.build_bundle", "verify", str(tmp_path / "nonexistent"))
    _refused(r, 2, "edge-bundle build --out DIR")


def test_bundle_verify_of_a_directory_that_is_not_a_bundle(tmp_path):
    r = _run("image.build_bundle", "verify", str(tmp_path))
    _refused(r, 2, "is not a bundle (no rootfs.files / config.json)")
    assert "edge-bundle build --out DIR" in r.stderr


def test_bundle_verify_of_malformed_records(tmp_path):
    (tmp_path / "rootfs.files").write_text("no tab here\n")
    (tmp_path / "config.json").write_text("{}\n")
    _refused(_run("image.build_bundle", "verify", str(tmp_path)), 2, f"--out {tmp_path} --force")


def test_bundle_build_refuses_an_existing_out_without_force(tmp_path):
    (tmp_path / "out").mkdir()
    r = _run("image.build_bundle", "build", "--out", str(tmp_path / "out"), "--package", str(tmp_path))
    _refused(r, 2, "pass --force to replace it")


def test_bundle_build_force_replaces_only_a_bundle(tmp_path):
    out = tmp_path / "home"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    r = _run("image.build_bundle", "build", "--out", str(out), "--force", "--package", str(tmp_path))
    _refused(r, 2, "--force replaces only a bundle")
    assert (out / "notes.txt").read_text() == "mine\n"


def test_bundle_build_refuses_a_package_that_is_not_one(tmp_path):
    r = _run("image.build_bundle", "build", "--out", str(tmp_path / "b"), "--package", str(tmp_path))
    _refused(r, 2, "build one with `edge-package build --out DIR`")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("args, fix", [
    (["--threads", "-1"], "give a number of threads above 0"),
    (["--user", "runtime"], "give UID or UID:GID as numbers"),
    (["--tcp", "localhost"], "write tcp://HOST:PORT"),
    (["--cdi-device", "gpu0"], "--cdi-device needs --cdi SPEC"),
    (["--cdi", "/nonexistent/spec.yaml"], "give a CDI spec file"),
    (["--python", "/nonexistent/python"], "give the environment's interpreter"),
])
def test_bundle_build_bad_options(tmp_path, args, fix):
    package = tmp_path / "pkg"  # passes the package check (the options are checked first)
    package.mkdir()
    (package / "manifest.json").write_text("{}")
    r = _run("image.build_bundle", "build", "--out", str(tmp_path / "b"), "--package", str(package), *args)
    _refused(r, 2, fix)
    assert not (tmp_path / "b").exists()


def test_bundle_build_out_under_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    r = _run("image.build_bundle", "build", "--out", str(tmp_path / "f" / "b"), "--package", str(tmp_path))
    _refused(r, 2, "is a file, not a directory")


# ----------------------------------------------------------------------------- edge-package


def test_package_out_that_cannot_be_created():
    r = _run("image.package_cli", "build", "--out", "/proc/edge-test-package")
    _refused(r, 2, "cannot create a directory in /proc")
    assert "give an --out on a writable filesystem" in r.stderr


def test_package_out_under_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    _refused(_run("image.package_cli", "build", "--out", str(tmp_path / "f" / "pkg")), 2, "is a file, not a directory")


def test_package_out_that_is_another_directory_is_not_replaced(tmp_path):
    (tmp_path / "notes.txt").write_text("mine\n")
    _refused(_run("image.package_cli", "build", "--out", str(tmp_path)), 2, "is a directory that is not a model package")
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_package_missing_corpus_is_named_before_the_build(tmp_path):
    corpus = tmp_path / "nonexistent.txt"
    r = _run("image.package_cli", "build", "--out", str(tmp_path / "pkg"), "--prune-corpus", str(corpus))
    _refused(r, 2, f"--prune-corpus {corpus}: no such file")
    assert "edge-package: [1/7]" not in r.stderr  # refused before the build began
    assert not (tmp_path / "pkg").exists()


def test_package_corpus_that_is_a_directory(tmp_path):
    r = _run("image.package_cli", "build", "--out", str(tmp_path / "pkg"), "--prune-corpus", str(tmp_path))
    _refused(r, 2, "is a directory; give the text files in it")


def test_package_help_says_what_the_ort_platform_means_and_the_exit_codes():
    r = _run("image.package_cli", "build", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "arm (default, the Jetson)" in text and "not this build host's" in text
    assert "exit status: 0" in text and "130 interrupted" in text and "143 terminated" in text


# ----------------------------------------------------------------------------- edge-tokenizer


def test_encode_of_plain_text_says_what_the_input_is(tokenizer_fb):
    r = _run("image.tokenizer.cli", "encode", "--tokenizer", str(tokenizer_fb), stdin="hello\n")
    _refused(r, 2, 'edge-tokenizer encode: line 1 is not JSON; input is JSON lines, one JSON string per line '
                   '(e.g. "hello")')


def test_encode_of_a_json_list(tokenizer_fb):
    r = _run("image.tokenizer.cli", "encode", "--tokenizer", str(tokenizer_fb), stdin='["hello"]\n')
    _refused(r, 2, "line 1: expected a JSON string, got list")


def test_encode_with_a_missing_tokenizer(tmp_path):
    r = _run("image.tokenizer.cli", "encode", "--tokenizer", str(tmp_path / "nope.fb"), stdin='"hello"\n')
    _refused(r, 2, "no such file")


def test_encode_with_an_uncompiled_tokenizer_names_the_compile_command(minilm_json):
    r = _run("image.tokenizer.cli", "encode", "--tokenizer", minilm_json, stdin='"hello"\n')
    _refused(r, 2, "edge-tokenizer compile tokenizer.json --out FILE.fb")


def test_encode_with_too_small_a_max_length(tokenizer_fb):
    r = _run("image.tokenizer.cli", "encode", "--tokenizer", str(tokenizer_fb), "--max-length", "1",
             stdin='"hello"\n')
    _refused(r, 2, "give at least 2")


def test_compile_into_a_directory_or_unwritable_place(minilm_json, tmp_path):
    _refused(_run("image.tokenizer.cli", "compile", minilm_json, "--out", str(tmp_path)), 2, "give a file name")
    _refused(_run("image.tokenizer.cli", "compile", minilm_json, "--out", "/proc/t.fb"), 2, "writable filesystem")
    _refused(_run("image.tokenizer.cli", "compile", str(tmp_path), "--out", str(tmp_path / "t.fb")), 2,
             "is a directory; give a file")


def test_prune_checks_the_corpus_and_held_out_first(minilm_json, tmp_path):
    r = _run("image.tokenizer.cli", "prune", minilm_json, "--corpus", str(tmp_path / "c.txt"),
             "--out", str(tmp_path / "p.fb"))
    _refused(r, 2, "--corpus")
    assert "no such file" in r.stderr
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello\n")
    r = _run("image.tokenizer.cli", "prune", minilm_json, "--corpus", str(corpus), "--out", str(tmp_path / "p.fb"),
             "--held-out", "2")
    _refused(r, 2, "up to, not including, 1")


# ----------------------------------------------------------------------------- edge-coldstart


def test_coldstart_with_a_package_that_is_not_one(tmp_path):
    r = _run("bench.coldstart.cli", "--runs", "1", "--package", str(tmp_path), cwd=tmp_path)
    _refused(r, 2, "build one with `edge-package build --out DIR`")


def test_coldstart_checks_its_outputs_before_the_runs(tmp_path):
    package = tmp_path / "pkg"  # any directory with a manifest passes the package check
    package.mkdir()
    (package / "manifest.json").write_text("{}")
    r = _run("bench.coldstart.cli", "--package", str(package), "--json", "/proc/coldstart.json", cwd=tmp_path)
    _refused(r, 2, "give a path on a writable filesystem")
    r = _run("bench.coldstart.cli", "--package", str(package), "--compare", str(tmp_path / "none.json"), cwd=tmp_path)
    _refused(r, 2, "give the --json record of an earlier run")
    assert "burn-in" not in r.stderr


def test_coldstart_bad_numbers(tmp_path):
    _refused(_run("bench.coldstart.cli", "--timeout-s", "0", cwd=tmp_path), 2, "give a number of seconds above 0")
    _refused(_run("bench.coldstart.cli", "--budget-ms", "-1", cwd=tmp_path), 2, "milliseconds above 0")


# ----------------------------------------------------------------------------- interrupts


def _start(module: str, *args: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd)


def _stderr_until(proc: subprocess.Popen, marker: bytes, deadline_s: float) -> bytes:
    """What ``proc`` wrote on stderr up to and including ``marker`` (read with a deadline)."""
    seen = b""
    end = time.monotonic() + deadline_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        while marker not in seen:
            left = end - time.monotonic()
            chunk = os.read(proc.stderr.fileno(), 65536) if left > 0 and sel.select(left) else None
            if not chunk:  # the deadline passed (None), or the process closed stderr: it exited (b"")
                proc.kill()
                _, err = proc.communicate()
                pytest.fail(f"no {marker!r} on stderr within {deadline_s} s (exit {proc.returncode}):\n"
                            f"{(seen + err).decode(errors='replace')}")
            seen += chunk
    return seen


def _comm(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip()
    except OSError:
        return b""


def _children_soon(pid: int, wanted=lambda comm: True, within_s: float = 10.0) -> list[int]:
    """``pid``'s descendants once one of them has a ``comm`` that is ``wanted`` (all of them after ``within_s``)."""
    end = time.monotonic() + within_s
    while True:
        kids = descendants(pid)
        if any(wanted(_comm(k)) for k in kids) or time.monotonic() > end:
            return kids
        time.sleep(0.005)


def _stop(proc: subprocess.Popen, sig: int, seen: bytes) -> tuple[int, str, str]:
    """Send ``sig``; the exit status, stdout and all of stderr. Kills it when it does not stop."""
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running 30 s after signal {sig}:\n{(seen + err).decode(errors='replace')}")
    return proc.returncode, out.decode(errors="replace"), (seen + err).decode(errors="replace")


def _gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    """Those of ``pids`` still alive after ``within_s`` (zombies of other parents count as gone)."""
    end = time.monotonic() + within_s
    while True:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if state != b"Z":
                alive.append(pid)
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


@pytest.mark.process
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated")])
def test_package_build_stops_cleanly(tmp_path, sig, code, word):
    """Stopped while it writes into the staging directory: the directory goes, nothing else is left."""
    if shutil.which("edge-package") is None:
        pytest.skip("the console scripts are not installed")
    out = tmp_path / "pkg"
    proc = subprocess.Popen([shutil.which("edge-package"), "build", "--out", str(out)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = _stderr_until(proc, b"] writing mappable weights", deadline_s=60)  # the staging directory exists from step 3
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pkg.")], "no staging directory to clean"
    kids = descendants(proc.pid)
    rc, stdout, stderr = _stop(proc, sig, seen)
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
    assert rc == code, stderr
    assert f"edge-package build: {word}; nothing half-written was left" in stderr
    assert list(tmp_path.iterdir()) == [], "the package or a staging directory was left beside it"
    assert _gone(kids) == []


@pytest.mark.container
def test_bundle_build_sigterm_while_tracing_stops_the_traced_runtime(minilm_package, tmp_path):
    """SIGTERM to edge-bundle alone while the runtime boots under the tracer (strace passes no
    SIGTERM on): 143, no staging directory, and the traced runtime does not outlive it."""
    out = tmp_path / "bundle"
    proc = _start("image.build_bundle", "build", "--out", str(out), "--package", str(minilm_package))
    seen = _stderr_until(proc, b"tracing boot to READY", deadline_s=60)
    kids = _children_soon(proc.pid, lambda comm: comm != b"strace")  # the runtime itself, under strace or not
    rc, stdout, stderr = _stop(proc, signal.SIGTERM, seen)
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
    assert rc == 143, stderr
    assert "edge-bundle build: terminated; nothing was written" in stderr
    assert list(tmp_path.iterdir()) == []
    assert _gone(kids) == [], "a traced process outlived edge-bundle"


@pytest.mark.process
def test_coldstart_sigterm_stops_its_runs(minilm_package, tmp_path):
    proc = _start("bench.coldstart.cli", "--runs", "1", "--package", str(minilm_package), "--json",
                  str(tmp_path / "record.json"), cwd=tmp_path)
    seen = _stderr_until(proc, b"burn-in: process start", deadline_s=60)
    kids = _children_soon(proc.pid)  # the runtime being started (or the next run's)
    rc, stdout, stderr = _stop(proc, signal.SIGTERM, seen)
    assert "Traceback" not in stderr and "Traceback" not in stdout, stderr
    assert rc == 143, stderr
    assert "edge-coldstart: terminated; the runs were stopped, no record written" in stderr
    assert not (tmp_path / "record.json").exists()
    assert _gone(kids) == []
