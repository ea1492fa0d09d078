"""The socket directory of a bundle: made ready, the same way, by every tool that starts one.

A bundle's runtime binds ``ipc:///run/edge/edge.sock`` in a host directory bind-mounted at
``/run/edge`` (``socket_dir`` in ``edge-bundle.json``). It runs as a non-root uid, so it can bind
there only if that directory is its own, and it can take its lock ``edge.sock.lock`` only if no
other user's file holds the name. In the field, ``edge serve`` run by hand as root left a
root-owned ``/run/edge`` with root's ``edge.sock`` and ``edge.sock.lock`` (0600), and every start
of the bundle failed in its ``bind`` stage with advice (``--bind``) a bundle's user cannot follow.

So whoever starts a bundle (edge-supervise, ``edge-coldstart --bundle``, ``edge-bundle
snapshot``, the installer before it restarts the unit) first calls :func:`prepare_socket_dir`:

* the directory is created when missing (its missing parents root's, 0755), and made the
  runtime's uid:gid, mode 0750 (the runtime and the host apps of its group; nobody else). The
  directory is opened with ``O_NOFOLLOW`` and changed through that descriptor only, so a link
  swapped in meanwhile is never followed;
* it is refused (:class:`SocketDirError`, never "fixed") when it is a symlink (whoever made the
  link would choose where the socket goes, and we would chown the target), not a directory, or
  writable by others: such a directory is shared by design (``/tmp``) or was opened up by
  someone, so taking it over would take it from its other users, and anything in it may have
  been planted. Group-writable is refused too unless the group is root's or the runtime's own:
  then an unknown group shares it (the runtime's own ``ipc`` check refuses group-writable for
  the same reason); root's or the runtime's group are trusted, and the mode becomes 0750;
* leftovers of an earlier run that the runtime could not replace, because another uid owns
  them, are removed when nothing uses them: the socket file (when no one listens on it: an
  AF_UNIX connect is refused), its lock (when no one holds its flock) and the snapshot files
  (``snapshot-point.json``, ``snapshot-resume.json``), each only of the type a run leaves: a
  socket at the socket's name, a regular file at the others' (``lstat``; a symlink, or a regular
  file where the socket goes, stays). A live socket or lock is left alone: the
  runtime then says "another server is listening". Leftovers owned by the runtime's uid stay:
  the runtime removes its own stale socket and reuses its lock file itself. The snapshot tools
  (``snapshot_files=True``) also remove the snapshot files whoever owns them: a stale marker or
  resume record would be read as this run's.

Standard library only, and no annotations (Python 3.8 on a Jetson): edge-supervise, which runs on
the host's bare python3, is built with this module inside (image/supervisor_zipapp.py). Imported
by the runtime only when its bind fails (:func:`bind_advice`).
"""

import os
import stat

SOCKET_DIR_MODE = 0o750  # the runtime's user and its group (the host apps), nobody else
SOCKET_NAME = "edge.sock"
SNAPSHOT_FILES = ("snapshot-point.json", "snapshot-resume.json")  # edge/runtime/snapshot.py MARKER, RESUME


class SocketDirError(Exception):
    """A socket directory refused; ``reason`` is short and stable (``symlink``, ``not_a_directory``,
    ``writable_by_others``, ``writable_by_group``, ``blocked``), the message names the directory
    and what to do."""

    def __init__(self, reason, path, message):
        Exception.__init__(self, message)
        self.reason = reason
        self.path = path


def ipc_socket_name(address):
    """The socket file's name in an ``ipc://DIR/NAME`` address; None for any other address."""
    if address and address.startswith("ipc://"):
        name = os.path.basename(address[len("ipc://"):])
        return name if name not in ("", ".", "..") else None
    return None


def _sd_refuse(path, st, gid):
    """Raise SocketDirError for a directory (``st``: its lstat) that must not be the runtime's."""
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError as exc:
            target = f"? ({exc.strerror})"
        raise SocketDirError("symlink", path, (
            f"the socket directory {path} is a symlink to {target}: refused (whoever made the link chooses "
            f"where the runtime's socket goes, and preparing it would chown {target}); remove the link "
            f"(rm {path}) and start again: the start creates the directory"))
    if not stat.S_ISDIR(st.st_mode):
        raise SocketDirError("not_a_directory", path, (
            f"the socket directory {path} is not a directory (mode {st.st_mode:o}): move it away "
            f"(mv {path} {path}.old) and start again: the start creates the directory"))
    if mode & stat.S_IWOTH:
        raise SocketDirError("writable_by_others", path, (
            f"the socket directory {path} is writable by others (mode {mode:04o}): refused, not made the "
            f"runtime's (others share it, and anyone may have put files there); check what is in it, then "
            f"remove it (rm -r {path}) and start again, or chmod o-w {path}"))
    if mode & stat.S_IWGRP and st.st_gid not in (0, gid):
        raise SocketDirError("writable_by_group", path, (
            f"the socket directory {path} is writable by group {st.st_gid} (mode {mode:04o}), neither root's "
            f"nor the runtime's group {gid}: refused (that group shares it, and its members may have put "
            f"files there); check what is in it, then chmod g-w {path}, or remove it (rm -r {path})"))


def check_socket_dir(path, gid):
    """Read-only: raise SocketDirError when ``path`` would be refused; its lstat, or None when missing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    _sd_refuse(path, st, gid)
    return st


def make_parents(path):
    """The missing directories above ``path``, made root's 0755 whatever the umask (like /run's and
    /var/cache's): searchable by all, as a snapshot restore's paths must be. What exists stays as it is."""
    missing = []
    d = os.path.dirname(os.path.abspath(path))
    while d and not os.path.isdir(d):
        missing.append(d)
        d = os.path.dirname(d)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            continue
        os.chmod(d, 0o755)


def _sd_in_use(dir_fd, path, name):
    """Whether ``name`` is a socket someone listens on, or a lock file someone holds."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISSOCK(st.st_mode):
        import socket  # here: importing this module stays cheap (os, stat)

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.connect(os.path.join(path, name))
                return True
            except OSError:  # refused: nobody listens (a server that is gone)
                return False
    if stat.S_ISREG(st.st_mode):
        import fcntl

        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


def _sd_clean(dir_fd, path, uid, socket_name, snapshot_files):
    """Remove the leftovers the module docstring lists; (removed, live) names."""
    removed, live = [], []
    names = [socket_name, socket_name + ".lock"] if socket_name else []
    if names and any(_sd_in_use(dir_fd, path, n) for n in names):
        live, names = [n for n in names if os.path.lexists(os.path.join(path, n))], []
    for name in names + list(SNAPSHOT_FILES):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if st.st_uid == uid and not (snapshot_files and name in SNAPSHOT_FILES):
            continue  # the runtime's own: it replaces them itself
        if stat.S_ISDIR(st.st_mode):
            raise SocketDirError("blocked", path, (
                f"{os.path.join(path, name)} is a directory, where the runtime keeps a file of that name: "
                f"remove it (rm -r {os.path.join(path, name)}) and start again"))
        # Only what an earlier run leaves there: a socket at the socket's name, a regular file at
        # the others'. Anything else (a link, a regular file where the socket goes) was not left
        # by a run and stays: removing it would let a bundle's address choose what goes.
        expected = stat.S_ISSOCK if name == socket_name else stat.S_ISREG
        if not expected(st.st_mode):
            continue
        os.unlink(name, dir_fd=dir_fd)
        removed.append(name)
    return removed, live


def prepare_socket_dir(path, uid, gid, mode=SOCKET_DIR_MODE, *, socket_name=SOCKET_NAME, leftovers=True,
                       snapshot_files=False):
    """Make ``path`` the runtime's (uid:gid, ``mode``) and clear its stale leftovers (module
    docstring); a dict of what it did, for a log line. Raises SocketDirError for a directory it
    refuses, OSError for one it cannot change (not root). ``socket_name``: the socket file's name
    (:func:`ipc_socket_name` of the bundle's address; None: no socket). ``leftovers=False``:
    touch no file in it (the metrics directory). ``snapshot_files``: remove the snapshot files
    whoever owns them."""
    path = os.fspath(path)
    done = {"path": path, "created": False, "chowned_from": None, "chmodded_from": None, "removed": [], "live": []}
    check_socket_dir(path, gid)  # the reasons named, before anything is written
    make_parents(path)
    try:
        os.mkdir(path, 0o700)  # nobody else's until it is the runtime's
        done["created"] = True
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        check_socket_dir(path, gid)  # swapped since: a link or a file now (raises, naming it)
        raise
    try:
        st = os.fstat(fd)
        _sd_refuse(path, st, gid)  # what we opened, not what the name pointed at a moment ago
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
            if not done["created"]:
                done["chowned_from"] = f"{st.st_uid}:{st.st_gid}"
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
            if not done["created"]:
                done["chmodded_from"] = f"{stat.S_IMODE(st.st_mode):04o}"
        if leftovers:
            done["removed"], done["live"] = _sd_clean(fd, path, uid, socket_name, snapshot_files)
    finally:
        os.close(fd)
    return done


def prepare_host_dirs(uid, gid, metrics_dir=None, state_dir=None):
    """The other host directories a bundle binds read-write, made the runtime's (runc cannot bind a
    missing source): ``metrics_dir`` 0755 (node_exporter reads the textfile), ``state_dir`` 0750
    (the request journal, read by root's ``edge trace``). Nothing in them is touched; the same
    refusals as the socket directory's."""
    for d, mode in ((metrics_dir, 0o755), (state_dir, 0o750)):
        if d:
            prepare_socket_dir(d, uid, gid, mode, socket_name=None, leftovers=False)


def bind_advice(directory, host_dir=None, uid=None):
    """What to change when the runtime could not bind in a bundle's socket directory: the
    directory (as the container sees it, and ``host_dir`` on the host), its owner and mode, the
    runtime's uid, and the fix (the bundle's ``--bind`` is not the technician's to change)."""
    uid = os.getuid() if uid is None else uid
    gid = os.getgid()
    where = directory if not host_dir or host_dir == directory else f"{directory} (host: {host_dir})"
    fix_dir = host_dir or directory
    starters = "the tool that starts the bundle prepares it (edge-supervise, edge-coldstart --bundle)"
    try:
        st = os.stat(directory)
    except OSError as exc:
        return f"the bundle's socket directory {where} cannot be read ({exc.strerror}): {starters}"
    mode = stat.S_IMODE(st.st_mode)
    text = (f"the bundle's socket directory {where} belongs to uid {st.st_uid} gid {st.st_gid}, mode {mode:04o}, "
            f"and the runtime runs as uid {uid}: ")
    if st.st_uid != uid or not mode & stat.S_IWUSR:
        return text + f"{starters}; or chown {uid}:{gid} {fix_dir} && chmod 0750 {fix_dir}"
    return text + (f"a file in it the runtime cannot replace, or another server on it: {starters} and "
                   f"removes stale files; or stop the other server (systemctl stop edge)")
