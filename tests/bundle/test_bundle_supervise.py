"""systemd/edge-supervise with the real runc: READY passed on, WATCHDOG=1 fed by host-side
health probes, SIGTERM drains the runtime and the container is deleted.

A module of its own: the container of test_bundle_runc.py binds the same socket directory.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from bundle_support import REPO, runc_or_skip


def test_supervisor_relays_ready_feeds_the_watchdog_and_deletes_the_container(ort_bundle, tmp_path):
    runc = runc_or_skip()
    notify_path = tmp_path / "systemd-notify.sock"
    sd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sd.bind(str(notify_path))
    sd.settimeout(1.0)
    cid = f"edge-sup-{os.getpid()}"
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "1000000", "RUNTIME_DIRECTORY": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(REPO / "systemd" / "edge-supervise"), "--bundle", str(ort_bundle),
                             "--id", cid], env=env, stdout=open(tmp_path / "sup.log", "wb"), stderr=subprocess.STDOUT)
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum(b"WATCHDOG=1" in g for g in got) < 2:
            assert proc.poll() is None, (tmp_path / "sup.log").read_text()
            try:
                got.append(sd.recv(4096))
            except socket.timeout:
                pass
        listed = subprocess.run([runc, "list", "-q"], capture_output=True, text=True).stdout.split()
        assert cid in listed
        proc.terminate()
        assert proc.wait(40) == 0, (tmp_path / "sup.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run([runc, "delete", "--force", cid], capture_output=True)
        sd.close()
    fields = [f for g in got for f in g.split(b"\n")]
    assert fields.index(b"READY=1") < fields.index(b"WATCHDOG=1"), got
    assert sum(f == b"WATCHDOG=1" for f in fields) >= 2
    assert cid not in subprocess.run([runc, "list", "-q"], capture_output=True, text=True).stdout.split()
    assert "shutdown.done" in (tmp_path / "sup.log").read_text()
