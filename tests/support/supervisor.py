"""edge-supervise as it is installed: the one file `edge-bundle supervisor` builds from edge/supervise/
(image/supervisor_zipapp.py), built once per test process into a temporary directory."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_built: Path | None = None


def supervisor_file() -> Path:
    """The built edge-supervise (a zipapp, mode 0755; run it as ``python3 FILE ...``)."""
    global _built
    if _built is None or not _built.exists():
        from image.supervisor_zipapp import build

        work = Path(tempfile.mkdtemp(prefix="edge-supervise-build-"))
        atexit.register(shutil.rmtree, work, True)
        work.chmod(0o755)  # nspawn machines and containers' users read it through binds
        build(work / "edge-supervise")
        _built = work / "edge-supervise"
    return _built
