"""Runs of the floor (``floor.py``): the physical reference, measured like the runtime.

The floor is a Python process that does only what every server of the protocol must: start
the interpreter, import numpy and zmq (and msgpack), bind a ROUTER socket and answer one
request. It is started the way the mode starts the runtime, and timed the same way: the clock
starts just before the exec, the same client (``client.embed_and_check``) connects at once,
queues one ``infer`` and stops the clock at the first correct reply (the floor answers with the
reference embedding it was handed, so the cosine check passes).

- process (and the tracer's way): the runtime's interpreter and flags (``boot_argv``: ``python
  -S``) and environment (``boot_env``), ``floor.py`` by path, an ipc address in the run's work
  directory;
- ``--bundle``, ``--snapshot``, ``--unit``: ``runc run`` of a copy of the bundle's config.json
  (in the work directory; the bundle itself is never touched) whose process is the bundle's own
  interpreter and flags with ``-c`` and the floor's source, bound at ``floor.sock`` in the
  bundle's socket directory (the runtime's address, another file name), with the bundle's
  rootfs, environment, user, mounts, limits and seccomp profile. ``--snapshot``'s floor is that
  fresh process too (a restore has no exec); ``--unit``'s runs under runc directly, not under
  systemd (docs/coldstart.md, "The floor").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.coldstart.client import Client, embed_and_check
from bench.coldstart.launch import STOP_TIMEOUT_S, RunFailed, RunResult, clean_env, now_ns, start_timed
from edge.runtime.launch import boot_argv
from edge.system.readiness import stop_process

__all__ = ["FLOOR_SCRIPT", "FLOOR_SOCKET", "FloorBundle", "embedding_hex", "floor_bundle", "floor_interpreter",
           "floor_summary", "run_floor", "run_floor_bundle"]

FLOOR_SCRIPT = Path(__file__).resolve().parent / "floor.py"
FLOOR_SOCKET = "floor.sock"  # beside the runtime's socket, in the same directory


def floor_interpreter(argv: list[str] | None = None) -> list[str]:
    """The runtime's interpreter and its flags: ``boot_argv()`` (or a bundle's args) up to ``-m``."""
    argv = list(argv or boot_argv())
    return argv[:argv.index("-m")] if "-m" in argv else argv[:1]


def embedding_hex(reference) -> str:
    """The reference embedding as the floor takes it: float32 little-endian, in hex."""
    from array import array

    a = array("f", reference)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes().hex()


def _result(total_ns: int, t0: int, body: dict, cos: float, pid: int | None) -> RunResult:
    total_ms = total_ns / 1e6
    stages = body.get("stages_boottime_ns") or {}
    at = {k: round((v - t0) / 1e6, 3) for k, v in stages.items()}
    phases = {}
    if {"start", "import_numpy", "import_zmq", "bind"} <= set(at):
        phases = {"interpreter": [0.0, at["start"]], "import_numpy": [at["start"], at["import_numpy"]],
                  "import_zmq": [at["import_numpy"], at["import_zmq"]], "bind": [at["import_zmq"], at["bind"]],
                  "ready_to_reply": [at["bind"], round(total_ms, 3)]}
    reply = {"floor": body.get("floor"), "floor_pid": body.get("pid"), "address": body.get("address"),
             "not_ready_retries": body.get("not_ready_retries")}
    return RunResult("floor", total_ms, phases, None, reply, cos, pid)


def _check_floor(body: dict, address: str) -> None:
    if body.get("floor") is not True or body.get("address") != address:
        raise RunFailed(f"the reply on {address} is not the floor's: {dict(list(body.items())[:6])}")


def run_floor(workdir: Path, text: str, reference, *, timeout_s: float = 120.0) -> RunResult:
    """``python -S floor.py`` (the runtime's interpreter and flags), exec to first correct reply."""
    workdir.mkdir(parents=True, exist_ok=True)
    address = f"ipc://{workdir}/{FLOOR_SOCKET}"
    log = workdir / "floor.log"
    cmd = [*floor_interpreter(), str(FLOOR_SCRIPT), "--bind", address, "--embedding-hex", embedding_hex(reference)]
    proc, t0 = start_timed(cmd, workdir, log)
    client = Client(address)
    try:
        end, body, cos = embed_and_check(client, proc, text, reference, t0 + int(timeout_s * 1e9), log)
        _check_floor(body, address)
    finally:
        client.close()
        stop_process(proc, STOP_TIMEOUT_S)
    return _result(end - t0, t0, body, cos, proc.pid)


# ----------------------------------------------------------------- in the bundle's image (runc)


class FloorBundle:
    """A directory with the floor's config.json: the bundle's, its process replaced by the floor."""

    def __init__(self, path: Path, host_address: str, container_address: str, argv: list[str]) -> None:
        self.path, self.host_address, self.container_address, self.argv = path, host_address, container_address, argv


def _beside(address: str) -> str | None:
    """The floor's address beside an ipc address (same directory, :data:`FLOOR_SOCKET`); None for tcp."""
    if not address.startswith("ipc://") or "/" not in address[len("ipc://"):]:
        return None
    return address.rsplit("/", 1)[0] + "/" + FLOOR_SOCKET


def floor_bundle(bundle: Path, workdir: Path, reference, nofile: int | None = None) -> FloorBundle:
    """The floor's bundle in ``workdir``: ``bundle``'s config.json (its rootfs and bind sources made
    absolute, RLIMIT_NOFILE lowered to ``nofile`` where given) with the process's args replaced by
    the bundle's own interpreter and flags, ``-c`` and the floor's source. RunFailed where the
    bundle serves on tcp (the floor binds beside the runtime's ipc socket)."""
    src = bundle.resolve()
    meta = json.loads((src / "edge-bundle.json").read_text())
    config = json.loads((src / "config.json").read_text())
    args = config["process"]["args"]
    inside = meta.get("container_address") or args[-1]
    host_address, container_address = _beside(meta.get("address") or ""), _beside(inside)
    if host_address is None or container_address is None:
        raise RunFailed(f"the bundle serves on {meta.get('address')}: the floor binds beside an ipc socket only")
    argv = [*floor_interpreter(args), "-c", FLOOR_SCRIPT.read_text(), "--bind", container_address,
            "--embedding-hex", embedding_hex(reference)]
    config["process"]["args"] = argv
    config["root"]["path"] = str(src / config["root"]["path"])
    for m in config.get("mounts") or []:
        if m.get("type") == "bind" and not os.path.isabs(m["source"]):
            m["source"] = str(src / m["source"])
    if nofile is not None:
        for r in config["process"].get("rlimits") or []:
            if r["type"] == "RLIMIT_NOFILE":
                r["soft"] = r["hard"] = min(r["hard"], nofile)
    out = workdir / "floor-bundle"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    shutil.copyfile(src / "edge-bundle.json", out / "edge-bundle.json")
    return FloorBundle(out, host_address, container_address, argv)


def run_floor_bundle(fb: FloorBundle, workdir: Path, text: str, reference, *, timeout_s: float = 120.0,
                     runc: str = "runc") -> RunResult:
    """``runc run`` of the floor's bundle (as root): exec of runc to first correct reply."""
    from bench.coldstart.runtime_runs import stop_container

    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "floor.log"
    cid = f"edge-coldstart-{os.getpid()}-floor-{workdir.name}"
    runc_bin = shutil.which(runc) or runc
    host_path = fb.host_address[len("ipc://"):]
    try:
        os.unlink(host_path)  # a floor killed earlier may have left its socket file
    except OSError:
        pass
    with open(log, "wb") as out:
        t0 = now_ns()
        proc = subprocess.Popen([runc_bin, "run", "--bundle", str(fb.path), cid], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, env=clean_env({}))
    client = Client(fb.host_address)
    try:
        end, body, cos = embed_and_check(client, proc, text, reference, t0 + int(timeout_s * 1e9), log)
        _check_floor(body, fb.container_address)
    finally:
        client.close()
        stop_container(proc, runc_bin, cid)
    return _result(end - t0, t0, body, cos, proc.pid)


# ----------------------------------------------------------------- the figures


def floor_summary(pairs: list[dict], median_ms: float | None, fresh_median_ms: float | None = None) -> dict:
    """``floor_median_ms`` (and p95, min), ``ratio_over_floor`` (the runtime's median over the
    floor's); with --snapshot also ``fresh_ratio_over_floor``. Null where there was no floor run."""
    from bench.coldstart.report import stats

    st = stats([p["floor"]["total_ms"] for p in pairs if p.get("floor")])
    floor = st["median"]
    out = {"floor_median_ms": floor, "floor_p95_ms": st["p95"], "floor_min_ms": st["min"], "floor_runs": st["n"],
           "ratio_over_floor": round(median_ms / floor, 2) if floor and median_ms else None}
    if fresh_median_ms is not None:
        out["fresh_ratio_over_floor"] = round(fresh_median_ms / floor, 2) if floor else None
    return out
