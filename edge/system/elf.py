"""What machine an ELF file is for: the bundle builder checks its interpreter with it, and the
installer reads a device root's architecture from its /bin/sh."""

from __future__ import annotations

__all__ = ["ELF_MACHINES", "elf_machine"]

ELF_MACHINES = {3: "i686", 40: "armv7l", 62: "x86_64", 183: "aarch64", 243: "riscv64"}  # e_machine -> uname -m


def elf_machine(path) -> str | None:
    """``uname -m`` name of an ELF file's machine (``e_machine=N`` when unknown), or None when
    it is not ELF or cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    code = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")  # EI_DATA: 1 little-endian
    return ELF_MACHINES.get(code, f"e_machine={code}")
