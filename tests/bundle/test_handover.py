"""The handover's pieces outside a machine (edge/supervise/handover.py): the alternating ids, the
memory check, ``--reload``'s wait on the start record against a real process, and the runtime's
check of the name it is told to bind beside the old runtime. The whole handover runs under a real
systemd in tests/install/test_trial_snapshot_systemd.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from edge.errors import BootError
from edge.runtime.snapshot import beside_name as runtime_beside_name
from edge.supervise import handover
from edge.supervise.main import container_ids
from edge.supervise.start_record import START_RECORD


def test_the_served_container_alternates_between_two_ids_and_cleanup_knows_both():
    assert handover.other_id("edge", "edge") == "edge-b"
    assert handover.other_id("edge", "edge-b") == "edge"
    assert set(container_ids("edge")) == {"edge", "edge-b", "edge-snapshot"}
    name = handover.beside_name({"address": "ipc:///run/edge/edge.sock"}, "edge-b")
    assert name == ".edge.sock.edge-b"
    assert runtime_beside_name({"beside": name}) == name  # what the runtime accepts, it binds


@pytest.mark.parametrize("bad", ["edge.sock", "../x", ".a/b", "." * 80, ".", ".."])
def test_the_runtime_refuses_a_beside_name_that_is_not_a_hidden_file_of_its_directory(bad):
    with pytest.raises(BootError):
        runtime_beside_name({"beside": bad})
    assert runtime_beside_name({"restored": True}) is None


def test_a_restore_needs_its_images_and_mapped_files_and_too_little_memory_is_refused(tmp_path):
    (tmp_path / "snapshot.json").write_text(json.dumps(
        {"image_bytes": 150 << 20, "runtime": {"files": [{"size": 90 << 20}, {"size": 1 << 20}]}}))
    need = handover.restore_need(str(tmp_path))
    assert need == (150 << 20) + (91 << 20) + handover.MEMORY_MARGIN
    assert handover.memory_problem(1 << 20) is None  # this machine has a MiB to spare
    why = handover.memory_problem(1 << 60)
    assert why is not None and "needs" in why and "MiB left" in why


SUPERVISOR = textwrap.dedent("""
    import json, os, signal, sys, time
    d, outcome = sys.argv[1], sys.argv[2]
    def write(h):
        with open(os.path.join(d, "start.json.tmp"), "w") as f:
            json.dump({"pid": os.getpid(), "handover": h}, f)
        os.replace(os.path.join(d, "start.json.tmp"), os.path.join(d, "start.json"))
    write({"seq": 1, "state": "done"})
    hups = []
    signal.signal(signal.SIGHUP, lambda *_: hups.append(1))
    print("ready", flush=True)
    while not hups:
        time.sleep(0.01)
    write({"seq": 2, "state": "running"})
    time.sleep(0.3)
    write({"seq": 2, "state": outcome, "error": "why"})
    time.sleep(30)
""")


@pytest.mark.parametrize("outcome,code", [("done", 0), ("failed", 1)])
def test_reload_signals_the_supervisor_and_waits_for_this_handovers_outcome(tmp_path, outcome, code):
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(tmp_path), outcome], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        assert handover.reload(proc.pid, str(tmp_path), timeout_s=20) == code
        assert time.monotonic() - t0 >= 0.3  # the earlier handover's "done" was not taken for this one's
        assert json.loads((tmp_path / START_RECORD).read_text())["handover"]["state"] == outcome
    finally:
        proc.kill()
        proc.wait()


def test_reload_fails_when_the_supervisor_is_gone(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert handover.reload(proc.pid, str(tmp_path), timeout_s=5) == 1
    assert not os.path.exists(tmp_path / START_RECORD)
