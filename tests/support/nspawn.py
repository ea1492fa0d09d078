"""A machine under a real systemd: ``systemd-nspawn`` boots systemd 252 as PID 1 with the host's
/usr and a throwaway root (a volatile root over the host's /usr; the recipe was worked out on this
project's lab machines).

One copy of the command and its traps, for every test that boots one (tests/bundle/
test_bundle_systemd.py, tests/support/trial_machine.py, tests/gateway/test_gateway_systemd.py):
each flag below was found by trying. The machine runs ``probe.service``, a oneshot of the test's
that does the checks, writes its results under /out and powers off.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

__all__ = ["UNITS", "nspawn_or_skip", "nspawn_command", "boot_to_poweroff", "power_cut"]

UNITS = "/etc/systemd/system"  # in the machine: its /etc is the throwaway root's, the units are bound in

# - without systemd.firstboot=off the boot waits forever in the first-boot wizard;
# - without the /sys/fs/cgroup bind runc cannot create its cgroup (read-only file system);
# - without the keyring system calls runc fails with "unable to join session keyring";
# - without --capability=all the container's init fails with "operation not permitted".
_FLAGS = ("--quiet", "--volatile=yes", "-D", "/", "--register=no", "--keep-unit", "--capability=all",
          "--system-call-filter=add_key keyctl request_key @mount @privileged @raw-io",
          "--bind=/sys/fs/cgroup:/sys/fs/cgroup")


def nspawn_or_skip() -> str:
    nspawn = shutil.which("systemd-nspawn")
    if nspawn is None:
        pytest.skip("systemd-nspawn is not installed (Debian package systemd-container)")
    if shutil.which("runc") is None or os.geteuid() != 0:
        pytest.skip("runc as root is needed")
    return nspawn


def nspawn_command(nspawn: str, nsp: Path, out: Path, binds: list[str], *, private_network: bool = False) -> list[str]:
    """Boot with ``nsp`` at /nsp and ``out`` at /out (both writable), ``binds`` (nspawn's
    ``--bind=``/``--bind-ro=`` options), and ``probe.service`` wanted at boot (bind it in).
    ``private_network``: a network namespace of the machine's own, loopback only (its ports
    are then not the host's: a listener on 127.0.0.1:8080 there meets nothing of the host)."""
    return [nspawn, *_FLAGS, *(["--private-network"] if private_network else []), f"--bind={nsp}:/nsp",
            f"--bind={out}:/out", *binds, "-b", "systemd.firstboot=off", "systemd.wants=probe.service"]


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(name))
    return tree


def power_cut(proc: subprocess.Popen) -> None:
    """Kill the machine at once: its PID 1 first (the kernel then kills every process of its PID
    namespace, the runc container's included), then nspawn. Killing nspawn alone is not enough:
    the container's systemd outlives it, reparented to the host's init, and goes on running."""
    tree, todo, inits = _children(), [proc.pid], []
    while todo:
        pid = todo.pop()
        for child in tree.get(pid, []):
            try:
                comm = Path(f"/proc/{child}/comm").read_text().strip()
            except OSError:
                continue
            (inits.append(child) if comm == "systemd" else todo.append(child))
    for pid in inits:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{pid}") for pid in inits) and time.monotonic() < deadline:
        time.sleep(0.05)  # PID 1's namespace is torn down: its processes are gone, their locks released


def boot_to_poweroff(cmd: list[str], log_path: Path, timeout_s: float, *, kill_when: Callable[[], bool] | None = None,
                     describe: Callable[[], str] = lambda: "", env: dict | None = None) -> float | None:
    """Run the machine until it powers off; its console in ``log_path``. Over ``timeout_s`` it is
    cut (AssertionError with ``describe()``). ``kill_when``: polled every 10 ms; once true, the
    machine is cut and the seconds into the boot are returned (None when it powered off). ``env``:
    nspawn's environment (None: this process's)."""
    with open(log_path, "w") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s:
                    raise AssertionError(f"the machine ran over {timeout_s} s: {describe()}")
                if kill_when is not None and kill_when():
                    power_cut(proc)
                    return round(time.monotonic() - t0, 3)
                time.sleep(0.01)
        finally:
            if proc.poll() is None:
                power_cut(proc)
    return None
