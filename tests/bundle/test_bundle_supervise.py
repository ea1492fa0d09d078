"""edge-supervise (the file `edge-bundle supervisor` builds) with the real runc: READY passed on, WATCHDOG=1 fed by host-side
health probes, SIGTERM drains the runtime and the container is deleted; the bundle as built
(its own config.json: RLIMIT_NOFILE 65536), started by hand on a host that may not grant that.

A module of its own: the container of test_bundle_runc.py binds the same socket directory.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest

from edge.system.readiness import NotifiedProcess

from support.bundles import host_nofile, runc_or_skip, supervisor_events
from support.supervisor import supervisor_file


def test_nofile_grant_is_what_setrlimit_allows_and_leaves_the_limit_as_it_was():
    from edge.supervise import bundle_start as sup

    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = before[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard RLIMIT_NOFILE here: anything can be granted")
    assert sup.nofile_grant(hard) == hard and sup.nofile_grant(64) == 64
    above = sup.nofile_grant(hard + 1)
    assert above in (hard, hard + 1)
    assert above == host_nofile(hard + 1)  # above the hard limit only with CAP_SYS_RESOURCE
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == before


def test_a_limit_it_cannot_grant_is_capped_in_a_runtime_copy_with_a_warning(tmp_path, monkeypatch, capsys):
    from edge.supervise import bundle_start as sup

    bundle, work = tmp_path / "bundle", tmp_path / "work"
    bundle.mkdir()
    work.mkdir()
    config = {"root": {"path": "rootfs", "readonly": True}, "mounts": [],
              "process": {"user": {"uid": 1, "gid": 1},
                          "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 65536, "soft": 65536},
                                      {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}]},
              "linux": {"resources": {"devices": []}}}
    text = json.dumps(config)
    (bundle / "config.json").write_text(text)
    monkeypatch.setattr(sup, "nofile_grant", lambda wanted: min(wanted, 1024))
    assert sup.nofile_cap(str(bundle)) == 1024
    (line,) = capsys.readouterr().out.splitlines()
    event = json.loads(line)
    assert event["event"] == "supervise.nofile_capped" and (event["wanted"], event["granted"]) == (65536, 1024)
    assert event["warning"] == ("bundle asks NOFILE 65536, this process may grant 1024 at most (no CAP_SYS_RESOURCE "
                                "to raise its hard limit); starting with 1024; raise it with LimitNOFILE= in "
                                "edge.service")
    assert sup.runtime_bundle(str(bundle), {}, str(work), 1024) == str(work)
    written = json.loads((work / "config.json").read_text())
    assert written["process"]["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024},
                                             {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}]
    assert written["root"]["path"] == str(bundle / "rootfs")
    assert (bundle / "config.json").read_text() == text  # the bundle itself: untouched
    # Granted: no copy, no warning.
    monkeypatch.setattr(sup, "nofile_grant", lambda wanted: wanted)
    assert sup.nofile_cap(str(bundle)) is None and capsys.readouterr().out == ""
    assert sup.runtime_bundle(str(bundle), {}, str(work), None) == str(bundle)
    # A snapshot taken under the cap is stale once the limit is granted (and the other way round).
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "config.json").write_text(json.dumps(written))
    assert sup.nofile_differs(str(snap), str(work)) is None
    assert sup.nofile_differs(str(snap), str(bundle)) == "taken with RLIMIT_NOFILE 1024, this start's is 65536"


def _container_nofile(runc: str, cid: str) -> list[int]:
    """The container init's RLIMIT_NOFILE (soft, hard), read from the host."""
    pid = json.loads(subprocess.run([runc, "state", cid], capture_output=True, text=True, check=True).stdout)["pid"]
    (line,) = [line for line in open(f"/proc/{pid}/limits") if line.startswith("Max open files")]
    return [int(x) for x in line.split()[3:5]]


def test_supervisor_relays_ready_feeds_the_watchdog_and_deletes_the_container(ort_bundle, tmp_path):
    runc = runc_or_skip()
    cid = f"edge-sup-{os.getpid()}"
    env = {**os.environ, "WATCHDOG_USEC": "1000000", "RUNTIME_DIRECTORY": str(tmp_path)}
    config_before = (ort_bundle / "config.json").read_bytes()
    (wanted,) = [r["hard"] for r in json.loads(config_before)["process"]["rlimits"] if r["type"] == "RLIMIT_NOFILE"]
    granted = host_nofile(wanted)  # what this process (and so the supervisor, its child) can grant runc
    # The bundle itself, not a lowered copy: the supervisor caps what this host cannot grant.
    sup = NotifiedProcess([sys.executable, str(supervisor_file()), "--bundle", str(ort_bundle),
                           "--id", cid, "--snapshot", "off"],  # no snapshot beside the cached bundle (own tests)
                          notify_path=tmp_path / "systemd-notify.sock", log_path=tmp_path / "sup.log", env=env)
    try:
        sup.notify.wait_for(b"WATCHDOG=1", sup.proc, 120, count=2, describe=lambda: sup.output(None))
        listed = subprocess.run([runc, "list", "-q"], capture_output=True, text=True).stdout.split()
        assert cid in listed
        assert _container_nofile(runc, cid) == [granted, granted], sup.output(None)
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
    log = (tmp_path / "sup.log").read_text()
    assert "shutdown.done" in log
    capped = supervisor_events(log, "supervise.nofile_capped")
    if granted < wanted:  # this host: root without CAP_SYS_RESOURCE, hard limit below 65536
        (event,) = capped
        assert (event["wanted"], event["granted"]) == (wanted, granted), event
        assert f"bundle asks NOFILE {wanted}, this process may grant {granted} at most" in event["warning"], event
        assert "LimitNOFILE= in edge.service" in event["warning"], event
    else:
        assert capped == [], capped
    assert (ort_bundle / "config.json").read_bytes() == config_before  # the bundle as signed
