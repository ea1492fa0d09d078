"""systemd/edge-supervise with the real runc: READY passed on, WATCHDOG=1 fed by host-side
health probes, SIGTERM drains the runtime and the container is deleted.

A module of its own: the container of test_bundle_runc.py binds the same socket directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from edge.readiness import NotifiedProcess

from bundle_support import REPO, runc_or_skip, runnable_bundle


def test_supervisor_relays_ready_feeds_the_watchdog_and_deletes_the_container(ort_bundle, tmp_path):
    runc = runc_or_skip()
    cid = f"edge-sup-{os.getpid()}"
    env = {**os.environ, "WATCHDOG_USEC": "1000000", "RUNTIME_DIRECTORY": str(tmp_path)}
    bundle = runnable_bundle(ort_bundle, tmp_path)  # its open-files limit lowered where this host cannot grant it
    sup = NotifiedProcess([sys.executable, str(REPO / "systemd" / "edge-supervise"), "--bundle", str(bundle), "--id", cid,
                           "--snapshot", "off"],  # no snapshot beside the cached bundle (tests of their own)
                          notify_path=tmp_path / "systemd-notify.sock", log_path=tmp_path / "sup.log", env=env)
    try:
        sup.notify.wait_for(b"WATCHDOG=1", sup.proc, 120, count=2, describe=lambda: sup.output(None))
        listed = subprocess.run([runc, "list", "-q"], capture_output=True, text=True).stdout.split()
        assert cid in listed
        # Its start record (edge-coldstart --unit reads it): this process, in order, fresh, no snapshot.
        record = json.loads((tmp_path / "start.json").read_text())
        assert record["pid"] == sup.proc.pid and record["container_id"] == cid, record
        assert record["start"] == "fresh" and record["snapshot"] == "off", record
        t = record["boottime_ns"]
        assert t["supervisor"] < t["runc"] < t["ready"] <= time.clock_gettime_ns(time.CLOCK_BOOTTIME), t
        assert sup.stop(40) == 0, sup.output(None)  # SIGTERM: the drain path
    finally:
        sup.stop()
        subprocess.run([runc, "delete", "--force", cid], capture_output=True)
    fields = sup.notify.fields()
    assert fields.index(b"READY=1") < fields.index(b"WATCHDOG=1"), sup.notices
    assert sum(f == b"WATCHDOG=1" for f in fields) >= 2
    assert cid not in subprocess.run([runc, "list", "-q"], capture_output=True, text=True).stdout.split()
    assert "shutdown.done" in (tmp_path / "sup.log").read_text()
