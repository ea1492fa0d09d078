"""runc, as the supervisor calls it: one command, whether a container has stopped, and a container
started with ``-d`` (not our child) watched through a pidfd."""

import json
import os
import select
import signal
import subprocess
import time


STOP_TIMEOUT_S = 15.0  # the runtime drains up to 10 s; below the unit's TimeoutStopSec (20 s)


def run_runc(args, runc, **kw):
    return subprocess.run([runc, *args], capture_output=True, text=True, **kw)


def snapshot_id(cid):
    """The id of the container that takes the snapshot beside container ``cid``."""
    return f"{cid}-snapshot"


def stop_container(container, cid, runc):
    """Stop container ``cid`` (its ``runc run`` Popen or a :class:`Detached`) as the unit's stop does:
    TERM, up to STOP_TIMEOUT_S to drain, then KILL; then delete. True when it ended on the TERM."""
    run_runc(["kill", cid, "TERM"], runc)
    try:
        container.wait(STOP_TIMEOUT_S)
        ended = True
    except subprocess.TimeoutExpired:
        run_runc(["kill", cid, "KILL"], runc)
        container.wait()
        ended = False
    run_runc(["delete", "--force", cid], runc)
    return ended


def container_stopped(cid, runc):
    """Whether container ``cid``'s process has ended. runc 1.1's ``runc run`` with a notify socket
    waits for READY=1 while /proc/<init> exists, and the init it has not reaped yet still has
    one: a runtime that exits before READY leaves runc waiting forever (the unit would fail only
    at TimeoutStartSec, 120 s later). ``runc state`` says "stopped" then."""
    r = run_runc(["state", cid], runc, timeout=10)
    if r.returncode != 0:
        return False  # not created yet
    try:
        return json.loads(r.stdout).get("status") == "stopped"
    except ValueError:
        return False



class Detached:
    """A container started with ``-d``: not our child, so its init is watched through a pidfd.
    ``poll``/``wait`` as a Popen's; its exit status is not ours to collect, so ``returncode`` is 1
    once it has ended (the caller says 0 when it ended after its own ``runc kill TERM``)."""

    def __init__(self, runc, cid):
        state = run_runc(["state", cid], runc)
        try:
            self.pid = int(json.loads(state.stdout)["pid"]) if state.returncode == 0 else 0
        except (ValueError, KeyError, TypeError):
            self.pid = 0
        self.returncode = None if self.pid > 0 else 1
        self._fd = None
        if self.pid > 0:
            try:
                self._fd = os.pidfd_open(self.pid)  # Linux 5.3
            except (AttributeError, OSError):
                pass  # an older kernel: signal 0 below

    def signal(self, sig):
        """Send ``sig`` to the container's init (through its pidfd: never a reused pid)."""
        if self._fd is not None:
            signal.pidfd_send_signal(self._fd, sig)
        elif self.pid > 0:
            os.kill(self.pid, sig)
        else:
            raise ProcessLookupError("the container has no running init")

    def _ended(self, timeout):
        if self._fd is not None:
            return bool(select.select([self._fd], [], [], timeout)[0])
        deadline = time.monotonic() + (timeout or 0)
        while True:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def poll(self):
        if self.returncode is None and self._ended(0):
            self.returncode = 1
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            if not self._ended(timeout):
                raise subprocess.TimeoutExpired(f"container (pid {self.pid})", timeout)
            self.returncode = 1
        return self.returncode

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


