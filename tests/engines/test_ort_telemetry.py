"""ONNX Runtime's telemetry stays off in the runtime (edge/engines/ort_capi.py, TELEMETRY_ENV).

ORT 1.29 and later start Microsoft's telemetry on Linux in CreateEnv: a device id and an event
cache under $HOME/.cache/Microsoft, and an uploader that resolves its collector's name some
seconds into serving (about 9 s here, up to 40 s in a loaded full suite). With the variable set,
ORT returns before any of it is created: no files, no uploader. So the files are the check: two
real runtimes start side by side, one as shipped and a control whose environment asks for the
telemetry (``ORT_DISABLE_TELEMETRY=0``, which the runtime leaves as it is); both serve a request;
the control must have written the telemetry's files (so the check can fail), the shipped one
none. The shipped one also runs under ``strace -e trace=connect``: nothing in its boot or its
request connects outside the machine's own sockets.

ORT also keeps its telemetry off wherever it sees a CI service's variable (CI, GITHUB_ACTIONS,
... : the names in ``_CI_MARKERS``, read off libonnxruntime 1.32), and this suite runs in CI: with
them inherited, the control wrote nothing there and the check of the shipped runtime proved
nothing. Both runtimes start without them, as on a device.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from edge.ipc.client import EdgeClient
from support.runtime_proc import start_runtime

pytestmark = pytest.mark.process


# The environment variables with which ORT 1.32 treats the process as a CI job or its own unit
# test and starts no telemetry (`strings libonnxruntime.so`, each checked by hand: set to "true",
# CI and GITHUB_ACTIONS leave the control without files). XDG_CACHE_HOME would move the files.
_CI_MARKERS = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL",
               "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR", "BITBUCKET_BUILD_NUMBER",
               "ORT_RUNNING_UNIT_TESTS", "XDG_CACHE_HOME")
_AS_ON_A_DEVICE: dict[str, str | None] = dict.fromkeys(_CI_MARKERS)


def _inet_connects(trace: Path) -> list[str]:
    """The connect() calls to an address outside the machine's own sockets (AF_UNIX left out)."""
    lines = trace.read_text(errors="replace").splitlines()
    return [line for line in lines if "connect(" in line and ("AF_INET" in line or "AF_INET6" in line)]


def _telemetry_files(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in (home / ".cache").rglob("*")) if (home / ".cache").exists() else []


def test_the_runtime_writes_no_telemetry_and_connects_nowhere(tmp_path, minilm_package):
    trace = tmp_path / "shipped" / "connect.strace"
    shipped = start_runtime(tmp_path / "shipped", "--package", str(minilm_package), "--journal-dir", "off", env=_AS_ON_A_DEVICE,
                            wrap=["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace)])
    control = start_runtime(tmp_path / "control", "--package", str(minilm_package), "--journal-dir", "off",
                            env={**_AS_ON_A_DEVICE, "ORT_DISABLE_TELEMETRY": "0"})
    try:
        shipped.wait_ready()
        control.wait_ready()
        assert shipped.pid != shipped.proc.pid  # its MAINPID came: the finally below can stop it
        for rt in (shipped, control):
            with EdgeClient(rt.address, timeout_s=30) as c:
                assert len(c.embed(["an offline appliance"]).embeddings) == 1
        control_files = _telemetry_files(tmp_path / "control")
        assert any(f.endswith("deviceid") for f in control_files), control_files  # ORT's telemetry, when asked for
        assert _telemetry_files(tmp_path / "shipped") == []
        assert _inet_connects(trace) == [], _inet_connects(trace)
    finally:
        try:
            # strace, told to stop, would detach and leave the runtime serving: the runtime's own
            # pid (its MAINPID) stops first, then strace exits with it.
            if shipped.pid != shipped.proc.pid:
                os.kill(shipped.pid, signal.SIGTERM)
            shipped.stop()
        finally:
            control.stop()
