"""``python -m support.tamper_after_load FILE -- python -m edge.boot ARGS``: the runtime's own boot,
with ``FILE`` of its package changed (one byte flipped) right after the engine has loaded it.

The hash of the engine's files runs beside the engine's load (edge/runtime/engine_chain.py), so
which ends first is a race. Here the hash is made to wait until the file has been changed: the
boot then finds a tampered file while an engine loaded from it is already warming up, which is
the case to refuse (no READY, no reply). The stages keep their names, so the timeline and the
error read as in a real boot. The command after ``--`` is the one ``start_runtime`` builds; its
``python -m edge.boot`` is replaced by this process.
"""

from __future__ import annotations

import functools
import sys
import threading

TAMPER_WAIT_S = 60.0  # the hash waits at most this long for the change


def _flip(path, offset: int = 4096) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def install(name: str) -> threading.Event:
    """Wrap the engine's load (flip a byte of ``name`` after it) and the package's hashing (wait
    for the flip before hashing ``name``); returns the event set once the file has changed."""
    import edge.engines
    from edge.preload.manifest import ModelPackage

    tampered = threading.Event()
    real_load, real_verify = edge.engines.load_engine, ModelPackage.verify_files

    @functools.wraps(real_load)  # the stage keeps its name: load_engine
    def load_engine(pkg, *args, **kwargs):
        engine = real_load(pkg, *args, **kwargs)
        _flip(pkg.path(name))
        tampered.set()
        return engine

    def verify_files(self, names=None, **kwargs):
        if names is not None and name in names:
            tampered.wait(TAMPER_WAIT_S)
        return real_verify(self, names, **kwargs)

    edge.engines.load_engine = load_engine
    ModelPackage.verify_files = verify_files
    return tampered


def main(argv: list[str]) -> int:
    name, sep, *command = argv
    if sep != "--" or command[1:3] != ["-m", "edge.boot"]:
        raise SystemExit("usage: python -m support.tamper_after_load FILE -- python -m edge.boot ARGS")
    install(name)
    from edge.boot import main as boot_main

    return boot_main(command[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
