"""edge-bundle emulated's checks and commands (image/bundle/emulated.py); the real build under
qemu-user is tests/fleet/test_arm64.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from image.bundle import emulated
from image.bundle.emulated import EmulationError, check_binfmt


def _handler(tmp_path: Path, text: str | None) -> Path:
    binfmt = tmp_path / "binfmt_misc"
    binfmt.mkdir(parents=True)
    (binfmt / "register").write_text("")
    if text is not None:
        (binfmt / "qemu-aarch64").write_text(text)
    return binfmt


def test_an_unknown_architecture_is_refused():
    with pytest.raises(EmulationError, match=r"no emulated build for 'riscv64' \(known: aarch64\)"):
        check_binfmt("riscv64")


def test_a_missing_handler_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(emulated, "BINFMT", _handler(tmp_path, None))
    with pytest.raises(EmulationError, match="apt-get install qemu-user-static"):
        check_binfmt("aarch64", register=False)


def test_registering_without_qemus_handler_file_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(emulated, "BINFMT", _handler(tmp_path, None))
    monkeypatch.setattr(emulated, "BINFMT_CONF", tmp_path / "binfmt.d")
    with pytest.raises(EmulationError, match=r"qemu-aarch64.conf is missing.*qemu-user-static"):
        check_binfmt("aarch64")


def test_registering_writes_the_handlers_line(tmp_path, monkeypatch):
    binfmt = _handler(tmp_path, None)
    conf = tmp_path / "binfmt.d"
    conf.mkdir()
    line = ":qemu-aarch64:M::\\x7fELF:\\xff:/usr/libexec/qemu-binfmt/aarch64-binfmt-P:OPF"
    (conf / "qemu-aarch64.conf").write_text(f"# qemu\n{line}\n")
    monkeypatch.setattr(emulated, "BINFMT", binfmt)
    monkeypatch.setattr(emulated, "BINFMT_CONF", conf)
    with pytest.raises(EmulationError, match="qemu-aarch64 is missing"):  # a file is no kernel: nothing appears
        check_binfmt("aarch64")
    assert (binfmt / "register").read_text() == line


def test_a_handler_file_without_a_handler_line_is_refused(tmp_path, monkeypatch):
    conf = tmp_path / "binfmt.d"
    conf.mkdir()
    (conf / "qemu-aarch64.conf").write_text("# emptied by hand\n")
    monkeypatch.setattr(emulated, "BINFMT", _handler(tmp_path, None))
    monkeypatch.setattr(emulated, "BINFMT_CONF", conf)
    with pytest.raises(EmulationError, match="has no handler line"):
        check_binfmt("aarch64")


def test_a_handler_without_the_fix_binary_flag_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(emulated, "BINFMT", _handler(tmp_path, "enabled\ninterpreter /usr/bin/qemu\nflags: OC\n"))
    with pytest.raises(EmulationError, match=r"not enabled with the F \(fix binary\) flag \(flags: 'OC'\)"):
        check_binfmt("aarch64", register=False)
    monkeypatch.setattr(emulated, "BINFMT", _handler(tmp_path / "ok", "enabled\nflags: POF\n"))
    assert check_binfmt("aarch64", register=False).endswith("qemu-aarch64")


def test_the_roots_packages_are_pinned_to_this_hosts_versions_without_local_labels(monkeypatch):
    versions = {"numpy": "2.4.6", "pyzmq": "27.3.0", "flatbuffers": "25.12.19", "msgpack": "1.2.4",
                "torch": "2.13.0+cpu"}
    monkeypatch.setattr(emulated.metadata, "version", lambda name: versions[name])
    assert emulated._pins("torchscript")[-1] == "torch==2.13.0"  # PyPI's aarch64 wheel has no +cpu
    assert "numpy==2.4.6" in emulated._pins("torchscript")


def test_the_chroot_mounts_proc_and_dev_but_not_sys_and_binds_paths_at_their_own(tmp_path):
    cmd = emulated._chroot(tmp_path / "root", ["python", "-V"], binds=[Path("/srv/x")], env={"QEMU_CPU": "a"})
    assert cmd[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = cmd[-1]
    assert f"mount --rbind /proc {tmp_path}/root/proc" in script and f"{tmp_path}/root/dev" in script
    assert "/sys" not in script  # the host's CPU topology crashes the emulated cpuinfo (EMULATED_MASKS)
    assert f"mount --rbind /srv/x {tmp_path}/root/srv/x" in script
    assert "QEMU_CPU=a" in script and script.rstrip().endswith("'cd / && exec python -V'")


def test_a_missing_package_is_refused_before_the_root_is_entered(tmp_path, monkeypatch):
    monkeypatch.setattr(emulated, "check_binfmt", lambda arch, say=None: "qemu-aarch64")
    (tmp_path / "root" / "opt" / "edge" / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "root" / "opt" / "edge" / "venv" / "bin" / "python").write_text("")
    with pytest.raises(EmulationError, match="--package /nonexistent is not a directory"):
        emulated.build_in_root(tmp_path / "root", "aarch64", ["--out", str(tmp_path / "b"), "--package", "/nonexistent"])
    assert not (tmp_path / "b").exists()
