"""The installer stays off the runtime's boot path, and its parsers cost edge-bundle nothing."""

from __future__ import annotations

import re
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


def test_edge_never_imports_image():
    """edge/ does not import image/ (the layering rule): the archive's format, which the installer
    needs on the device, lives in edge/update/archive/, and the build host's packer imports it from there."""
    edge_dir = REPO_ROOT / "edge"
    crossing = sorted(str(p.relative_to(REPO_ROOT)) for p in edge_dir.rglob("*.py")
                      if re.search(r"^\s*(from|import) image\b", p.read_text(), flags=re.M))
    assert crossing == []
