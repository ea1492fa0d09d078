"""The serving socket's connections, as libzmq's monitor reports them.

Two attacks need to know which connection a message came on, which libzmq does not tell a
ROUTER's owner except through its monitor socket and each message's source descriptor:

* **A connection flood.** libzmq's ipc listener aborts the whole process when ``accept()``
  fails with EMFILE (``src/ipc_listener.cpp``: its errno_assert lists ENFILE but not EMFILE;
  the tcp listener tolerates both). So the server counts the connections it holds and, at
  ``cap``, *parks* the socket file: it renames it into a private (0700) directory beside it.
  New connects then fail at once (ENOENT; ZeroMQ clients retry every 100 ms) while every
  connection already open keeps working. Below ``resume`` the file goes back. Between the
  last event read and a rename, libzmq can accept at most its monitor pipe's worth of
  connections (it blocks on a full monitor pipe: measured 2,000 with both high-water marks
  at 1,000; ours is set to 1) plus the listen backlog, so the cap leaves that much room
  under the open-files limit (:func:`connection_cap`).
* **A reused routing id.** A ROUTER routes a reply by routing id, and a client chooses its
  own. A new connection that takes the id of one that closed would get that connection's
  replies. So each accepted connection gets a number (``conn``) that is never reused, each
  request is tagged with the number of the connection it came on (the message's ``SRCFD``
  looked up here), and a reply goes out only while that connection is still open. Its
  DISCONNECTED event is emitted before libzmq frees the routing id, and the server reads
  the events just before each send.

The owner (the I/O thread) calls :meth:`update` whenever the monitor socket is readable
and before each send; nothing here blocks.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct

import zmq

from edge.ipc.endpoint import remove_ipc_file

__all__ = ["Connections", "connection_cap", "DEFAULT_MAX_CONNECTIONS", "UNKNOWN_CONN"]

DEFAULT_MAX_CONNECTIONS = 4096  # held client connections (each costs 4-15 KB and one descriptor)
MONITOR_ROOM = 1536  # descriptors libzmq may still take after the event that reaches the cap
UNKNOWN_CONN = 0  # a message whose connection the monitor has not reported (never open)
_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


def connection_cap(open_files_soft: int | None = None, configured: int = DEFAULT_MAX_CONNECTIONS) -> int:
    """Connections to hold at most under a soft open-files limit (default: this process's):
    room is left for the server's own descriptors and for what libzmq accepts before the cap
    is seen."""
    if open_files_soft is None:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        open_files_soft = soft if soft != resource.RLIM_INFINITY else 1 << 20
    # Under ~3,000 descriptors the full room does not fit: half the limit is kept (a flood can
    # then still reach EMFILE; boot raises the soft limit to the hard one, see edge/boot.py).
    room = min(MONITOR_ROOM, open_files_soft // 2)
    return max(16, min(configured, open_files_soft - room))


class Connections:
    def __init__(self, router: zmq.Socket, ipc_path: str | None, cap: int) -> None:
        self.cap = cap
        self.resume = max(1, cap * 3 // 4)
        # Attached before bind, so no connection goes unseen. Our end holds one event: libzmq's
        # own end holds 1,000, and its I/O thread waits (accepts nothing) while both are full.
        self.monitor = router.get_monitor_socket(_EVENTS)
        self.monitor.setsockopt(zmq.RCVHWM, 1)
        self._path = ipc_path
        self._parked_dir = os.path.join(os.path.dirname(ipc_path), f".{os.path.basename(ipc_path)}.parked") \
            if ipc_path else None
        self._by_fd: dict[int, tuple[int, str | None]] = {}  # descriptor -> (connection number, peer)
        self._open: set[int] = set()  # numbers of the connections open now
        self._next = UNKNOWN_CONN + 1
        self.parked = False
        self._retired = False  # shutting down, or handed over: the socket file is gone for good
        self.inode: int | None = None  # our socket file's, once bound (the server sets it)
        self.handed_over = False  # another server took our address over (edge/ipc/endpoint.py take_over_ipc_file)
        self.parks = 0  # times the socket file was parked
        self.peak = 0  # most connections held at once

    @property
    def count(self) -> int:
        return len(self._open)

    def update(self) -> None:
        """Read every pending monitor event; park or restore the socket file on the counts."""
        while True:
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event, fd = struct.unpack("=HI", frames[0][:6])
            if event == zmq.EVENT_ACCEPTED:
                old = self._by_fd.get(fd)
                if old is not None:
                    self._open.discard(old[0])
                self._by_fd[fd] = (self._next, _peer_credentials(fd))
                self._open.add(self._next)
                self._next += 1
            elif event == zmq.EVENT_DISCONNECTED:
                old = self._by_fd.pop(fd, None)
                if old is not None:
                    self._open.discard(old[0])
        n = len(self._open)
        self.peak = max(self.peak, n)
        if self._path is None or self._retired:
            return
        if not self.parked and n >= self.cap:
            self._park()
        elif self.parked and n <= self.resume:
            self._restore()

    def conn_of(self, srcfd: int, peer_address: str | None) -> int:
        """The number of the open connection a message came on, or :data:`UNKNOWN_CONN` when
        that connection has closed. ``peer_address``: the message's ``Peer-Address`` property
        (``host:uid:gid:pid`` on ipc), told apart from a later connection on the same descriptor."""
        entry = self._by_fd.get(srcfd)
        if entry is None:
            # libzmq writes ACCEPTED before the connection's first message can flow, but the two
            # come through different pipes: the message can be read first (seen 1 run in 13 with 12
            # clients connecting at once). The event is pending by then; read it and look again.
            self.update()
            entry = self._by_fd.get(srcfd)
        if entry is None:
            return UNKNOWN_CONN
        conn, peer = entry
        if peer is not None and (peer_address or "").partition(":")[2] != peer:
            return UNKNOWN_CONN  # sent on an earlier connection whose descriptor was reused
        return conn

    def is_open(self, conn: int) -> bool:
        return conn in self._open

    def info(self) -> dict:
        """The ``connections`` block of ``stats``."""
        return {"open": len(self._open), "peak": self.peak, "cap": self.cap, "parked": self.parked,
                "parks": self.parks}

    # ---------------------------------------------------------------- the socket file

    def _files(self) -> tuple[str, str]:
        """(socket file, parked directory): both set on ipc, the only transport that parks (the
        callers return first on tcp)."""
        assert self._path is not None and self._parked_dir is not None
        return self._path, self._parked_dir

    def moved(self, path: str) -> None:
        """Our socket file is at ``path`` now (the server took over another's address)."""
        self._path = path
        self._parked_dir = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.parked")

    def _park(self) -> None:
        path, parked_dir = self._files()
        if self.inode is not None and _inode(path) != self.inode:
            return  # another server's file now (it took our address over): never move it
        try:
            os.mkdir(parked_dir, 0o700)
        except FileExistsError:
            st = os.lstat(parked_dir)  # ours and private, or not used at all
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                return
        try:
            os.rename(path, os.path.join(parked_dir, "sock"))
        except OSError:
            return
        self.parked = True
        self.parks += 1
        from edge.system.log import log

        log("ipc.connections_parked", level="warning", open=len(self._by_fd), cap=self.cap,
            resume_below=self.resume)

    def _restore(self) -> None:
        path, parked_dir = self._files()
        parked = os.path.join(parked_dir, "sock")
        try:
            # link, then unlink: unlike a rename, it never replaces a file that another server put
            # at the address while ours was parked (a handover, edge/ipc/endpoint.py take_over_ipc_file).
            os.link(parked, path)
        except FileNotFoundError:
            pass
        except FileExistsError:  # the address is another server's now: ours goes, for good
            self.handed_over = self._retired = True
            self.parked = False
            with contextlib.suppress(OSError):
                os.unlink(parked)
                os.rmdir(parked_dir)
            return
        except OSError:
            return
        with contextlib.suppress(OSError):
            os.unlink(parked)
            os.rmdir(parked_dir)
        self.parked = False
        from edge.system.log import log

        log("ipc.connections_restored", level="info", open=len(self._by_fd))

    def stop_accepting(self, inode: int | None) -> bool:
        """Shutdown, before the last reads: remove the socket file (parked or not) for good, so no
        new connection comes while the open ones are read to the end and answered. They keep
        working both ways; ``zmq_unbind`` would close them, and their replies with them.
        Nothing to do on tcp: its listener cannot be closed alone. False when the address was
        another server's by then (it took it over: ``handed_over``), whose file stays."""
        if self._path is None or self._retired:
            return not self.handed_over
        self._retired = True
        if inode is not None:
            if self.parked:
                remove_ipc_file(os.path.join(self._files()[1], "sock"), inode)
                self.handed_over = _inode(self._path) not in (None, inode)
            elif not remove_ipc_file(self._path, inode):
                self.handed_over = True
        if self.parked:
            with contextlib.suppress(OSError):
                os.rmdir(self._files()[1])
            self.parked = False
        return not self.handed_over

    def close(self) -> None:
        """Put a parked socket file back (the server removes it on close) and stop monitoring."""
        if self.parked:
            self._restore()
        self.monitor.close(0)


def _inode(path: str) -> int | None:
    try:
        return os.lstat(path).st_ino
    except OSError:
        return None


def _peer_credentials(fd: int) -> str | None:
    """``uid:gid:pid`` of the process at the other end of unix socket ``fd`` (as libzmq's
    ``Peer-Address`` ends), None for tcp or when it cannot be read."""
    import socket

    try:
        sock = socket.socket(fileno=fd)  # wraps libzmq's descriptor: never closed here
    except OSError:
        return None
    try:
        if sock.family != socket.AF_UNIX:
            return None
        pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return f"{uid}:{gid}:{pid}"
    except OSError:
        return None
    finally:
        sock.detach()
