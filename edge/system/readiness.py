"""Start a process that reports READY over sd_notify, wait for it with a deadline, stop it.

The listening side of ``edge/system/notify.py``: what systemd does for ``Type=notify``, for the
tools that start the runtime themselves (tests, benchmarks, the bundle tracer, the
supervisor's tests). One copy of "bind a datagram socket, start the process with
``NOTIFY_SOCKET`` pointing at it, wait for ``READY=1`` while watching that the process is
still alive, always stop it" instead of one per caller.

Never imported at boot: standard library only, and ``subprocess`` is loaded here, not by
the runtime.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

__all__ = ["NotifySocket", "NotifiedProcess", "NotReady", "READY", "stop_process"]

READY = b"READY=1"
POLL_S = 0.2  # how often a wait looks at the process while no datagram comes (s)


class NotReady(RuntimeError):
    """The process exited, or the deadline passed, before it sent the awaited field."""

    def __init__(self, message: str, *, exited: int | None = None) -> None:
        super().__init__(message)
        self.exited = exited  # the exit status when the process ended first, else None


class NotifySocket:
    """An AF_UNIX datagram socket bound at ``path``, keeping every datagram it received."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.unlink(missing_ok=True)  # left by an earlier run
        self.notices: list[bytes] = []  # datagrams, in arrival order
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(self.path))
        self._sock.settimeout(POLL_S)

    def fields(self) -> list[bytes]:
        """Every ``KEY=VALUE`` field received so far, in order."""
        return [f for n in self.notices for f in n.split(b"\n")]

    def mainpid(self) -> int | None:
        """The last ``MAINPID=`` a datagram carried (under strace or runc, not the child's pid)."""
        pids = [int(f[len(b"MAINPID="):]) for f in self.fields() if f.startswith(b"MAINPID=")]
        return pids[-1] if pids else None

    def receive(self, timeout_s: float = POLL_S) -> bytes | None:
        """One datagram (kept in ``notices``), or None when none came within ``timeout_s`` (0: none queued)."""
        self._sock.settimeout(timeout_s)
        try:
            data = self._sock.recv(65536)
        except (socket.timeout, BlockingIOError):  # BlockingIOError: timeout 0 and nothing queued
            return None
        self.notices.append(data)
        return data

    def wait_for(self, field: bytes, proc: subprocess.Popen, deadline_s: float, *, count: int = 1,
                 describe: Callable[[], str] = lambda: "", on_tick: Callable[[float], None] | None = None) -> float:
        """Seconds until ``field`` has arrived ``count`` times; NotReady when ``proc`` exits or time runs out.

        ``describe()`` adds context to the error (for example the log's tail);
        ``on_tick(elapsed_s)`` is called at least every POLL_S (a progress spinner).
        """
        t0 = time.monotonic()
        while True:
            elapsed = time.monotonic() - t0
            if sum(f == field for f in self.fields()) >= count:
                return elapsed
            if proc.poll() is not None:
                raise NotReady(f"exited {proc.returncode} before {field.decode()}:\n{describe()}", exited=proc.returncode)
            if elapsed >= deadline_s:
                raise NotReady(f"no {field.decode()} within {deadline_s:g} s:\n{describe()}")
            if on_tick is not None:
                on_tick(elapsed)
            self.receive(min(POLL_S, max(0.01, deadline_s - elapsed)))

    def close(self) -> None:
        """Keep what is still queued (``notices`` then holds all that was sent), then close."""
        if self._sock.fileno() != -1:
            while self.receive(0) is not None:
                pass
        self._sock.close()
        self.path.unlink(missing_ok=True)


def _terminate(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()


def stop_process(proc: subprocess.Popen, timeout_s: float = 30.0, *,
                 terminate: Callable[[subprocess.Popen], None] = _terminate,
                 kill: Callable[[subprocess.Popen], None] = _kill) -> int:
    """Ask ``proc`` to stop (``terminate``, default SIGTERM), wait ``timeout_s``, then ``kill``
    (default SIGKILL) and reap it; returns the exit status. Nothing to do once it has exited."""
    if proc.poll() is None:
        try:
            terminate(proc)
            proc.wait(timeout_s)
        except (subprocess.TimeoutExpired, OSError, subprocess.SubprocessError):
            kill(proc)
            proc.wait()
    return proc.returncode


class NotifiedProcess:
    """``cmd`` started with ``NOTIFY_SOCKET`` set to a socket we listen on; output to ``log_path``.

    ``terminate(proc)`` asks it to stop (default SIGTERM; a container passes ``runc kill``);
    :meth:`stop` escalates to ``kill(proc)`` (default SIGKILL) after ``timeout_s`` and always
    closes the socket. Use it as a context manager so a failing caller never leaves the
    process behind.
    """

    def __init__(self, cmd: list[str], *, notify_path: str | os.PathLike, log_path: str | os.PathLike,
                 env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 terminate: Callable[[subprocess.Popen], None] = _terminate,
                 kill: Callable[[subprocess.Popen], None] = _kill, new_session: bool = False) -> None:
        self.cmd = cmd
        self.log_path = Path(log_path)
        self.notify = NotifySocket(notify_path)
        self._terminate, self._kill = terminate, kill
        full_env = {**(os.environ if env is None else env), "NOTIFY_SOCKET": str(self.notify.path)}
        self.started = time.monotonic()
        try:
            with open(self.log_path, "wb") as out:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             env=full_env, cwd=cwd, start_new_session=new_session)
        except BaseException:
            self.notify.close()
            raise
        self.ready_s: float | None = None  # start to READY, once seen

    @property
    def notices(self) -> list[bytes]:
        """The datagrams received on the notify socket so far (all of them once stopped)."""
        return self.notify.notices

    @property
    def pid(self) -> int:
        """The runtime's pid: ``MAINPID=`` when it sent one (strace, runc), else the child's."""
        return self.notify.mainpid() or self.proc.pid

    def output(self, tail: int | None = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text if tail is None else text[-tail:]

    def wait_ready(self, deadline_s: float, on_tick: Callable[[float], None] | None = None) -> float:
        """Seconds from start to READY=1; NotReady (with the log's tail) if it never comes.

        ``deadline_s`` counts from the start; ``on_tick(seconds since the start)`` as in ``wait_for``.
        """
        tick = None if on_tick is None else (lambda _: on_tick(time.monotonic() - self.started))
        self.notify.wait_for(READY, self.proc, deadline_s - (time.monotonic() - self.started),
                             describe=self.output, on_tick=tick)
        self.ready_s = time.monotonic() - self.started
        return self.ready_s

    def stop(self, timeout_s: float = 30.0) -> int:
        """Ask it to stop, wait ``timeout_s``, then kill it; returns the exit status."""
        try:
            return stop_process(self.proc, timeout_s, terminate=self._terminate, kill=self._kill)
        finally:
            self.notify.close()

    def __enter__(self) -> "NotifiedProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
