"""Regenerate the FlatBuffers reader code of the tokenizer schema.

    python -m image.tokenizer.schema [--check]

Runs ``flatc --python`` (Debian's ``flatbuffers-compiler`` 2.0.8) on
``edge/preload/tokenizer.fbs`` into a temporary directory and copies the
``edge/preload/tokenizer_fb`` package out of it. flatc would also write empty
``__init__.py`` files for ``edge/`` and ``edge/preload/``, which is why it never
writes into the tree directly. ``--check`` compares instead of copying.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "edge" / "preload" / "tokenizer.fbs"
PACKAGE = ROOT / "edge" / "preload" / "tokenizer_fb"


def generate(out_dir: Path, flatc: str = "flatc") -> Path:
    """Run flatc into ``out_dir``; return the generated ``tokenizer_fb`` directory."""
    subprocess.run([flatc, "--python", "-o", str(out_dir), str(SCHEMA)], check=True)
    return out_dir / "edge" / "preload" / "tokenizer_fb"


def differences(generated: Path, checked_in: Path = PACKAGE) -> list[str]:
    """Names of the files that differ between a fresh generation and the tree."""
    names = sorted({p.name for p in generated.glob("*.py")} | {p.name for p in checked_in.glob("*.py")})
    return [
        n
        for n in names
        if not (generated / n).exists()
        or not (checked_in / n).exists()
        or not filecmp.cmp(generated / n, checked_in / n, shallow=False)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare with the checked-in code")
    ap.add_argument("--flatc", default="flatc")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        gen = generate(Path(tmp), args.flatc)
        if args.check:
            diff = differences(gen)
            print("differ: " + ", ".join(diff) if diff else "up to date")
            return 1 if diff else 0
        shutil.rmtree(PACKAGE, ignore_errors=True)
        shutil.copytree(gen, PACKAGE)
    print(f"wrote {PACKAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
