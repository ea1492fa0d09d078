"""The installer stays off the runtime's boot path, and its parsers cost edge-bundle nothing (what is
loaded, measured in a process; the import contract itself is tests/test_architecture.py)."""

from __future__ import annotations

import subprocess
import sys

import edge.update.install
from install_support import REPO_ROOT

PROBE = """
import sys
import edge.boot, edge.cli
booted = sorted(m for m in sys.modules if m.startswith(("edge.update.install", "pydantic", "cryptography")))
from image.build_bundle import main
from image.docs_options import parser_of
parser_of(main)
parsed = sorted(m for m in sys.modules if m.startswith(("pydantic", "cryptography")))
print(booted, parsed)
"""


def test_boot_path_and_parsers_import_no_installer():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []"


def test_public_names():
    for name in edge.update.install.__all__:
        assert getattr(edge.update.install, name) is not None, name

