"""Runs of a script in a fresh process: the sentence-transformers baseline and import probes.

The script (``baseline.py``) prints one JSON line with its result and phases; the clock
runs from its exec (``launch``) until that line is read and its embedding checked.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.coldstart.launch import (MIN_COSINE, STOP_TIMEOUT_S, RunFailed, RunResult, clean_env, cosine, decode_f32le,
                                    log_tail, now_ns)

__all__ = ["BASELINE_SCRIPT", "run_baseline", "run_import_probe"]

HERE = Path(__file__).resolve().parent
BASELINE_SCRIPT = HERE / "baseline.py"


def _run_script(kind: str, args: list[str], reference, timeout_s: float, list_files: bool, workdir: Path) -> RunResult:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{kind}.log"
    cmd = [sys.executable, str(BASELINE_SCRIPT), *args, *(["--list-files"] if list_files else [])]
    env = clean_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    with open(log, "wb") as err:
        t0 = now_ns()
        env["EDGE_EXEC_BOOTTIME_NS"] = str(t0)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, cwd=workdir, env=env)
    try:
        line = _read_line(proc, t0 + int(timeout_s * 1e9))
        if not line:
            proc.wait(STOP_TIMEOUT_S)
            raise RunFailed(f"{kind} exited {proc.returncode} without a result:\n{log_tail(log)}")
        record = json.loads(line)
        cos = None
        if "embedding_f32le_b64" in record:
            emb = decode_f32le(base64.b64decode(record["embedding_f32le_b64"]))
            cos = cosine(emb, reference) if reference is not None else 1.0
        end = now_ns()
        if cos is not None and not cos >= MIN_COSINE:
            raise RunFailed(f"{kind} result is wrong: cosine {cos:.6f} to the reference")
        listed = json.loads(proc.stdout.readline() or "{}").get("files", []) if list_files else []
        proc.wait(STOP_TIMEOUT_S)  # untimed: interpreter teardown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    phases = dict(record.get("phases", {}))
    phases["result_to_reply"] = [phases[list(phases)[-1]][1], round((end - t0) / 1e6, 3)] if phases else None
    return RunResult(kind, (end - t0) / 1e6, phases, None, {}, cos, record.get("pid"), [], listed,
                     record.get("embedding_f32le_b64"))


def _read_line(proc: subprocess.Popen, deadline_ns: int) -> bytes:
    """The child's first stdout line, or b"" when it exits or the deadline passes."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    fd = proc.stdout.fileno()
    try:
        while b"\n" not in buf:
            left = (deadline_ns - now_ns()) / 1e9
            if left <= 0:
                return b""
            if sel.select(min(left, 1.0)):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b""
                buf += chunk
    finally:
        sel.close()
    line, rest = buf.split(b"\n", 1)
    if rest:  # the --list-files line may already be here: put it back in front of the stream
        proc.stdout = _Prefixed(rest, proc.stdout)
    return line


class _Prefixed:
    def __init__(self, head: bytes, stream) -> None:
        self._head, self._stream = head, stream

    def readline(self) -> bytes:
        if b"\n" in self._head:
            line, self._head = self._head.split(b"\n", 1)
            return line + b"\n"
        line, self._head = self._head + self._stream.readline(), b""
        return line

    def close(self) -> None:
        self._stream.close()


def run_baseline(model_dir: Path, text: str, reference, workdir: Path, *, timeout_s: float = 300.0,
                 list_files: bool = False) -> RunResult:
    """sentence-transformers in a fresh process: import, load safetensors + tokenizer.json, encode."""
    return _run_script("baseline", [str(model_dir), text], reference, timeout_s, list_files, workdir)


def run_import_probe(module: str, workdir: Path, *, timeout_s: float = 300.0, list_files: bool = False) -> RunResult:
    """A fresh process that only imports ``module``: exec to import done."""
    return _run_script(f"import_{module}", ["--import-only", module], None, timeout_s, list_files, workdir)
