"""``edge-bundle supervisor --out FILE``: build edge-supervise, the host's supervisor, as one file.

systemd/edge.service runs ``/usr/bin/python3 /usr/local/lib/edge/edge-supervise``: a zipapp
(PEP 441) of edge/supervise/ and the modules of ``edge`` it imports (edge/system/'s socket
directories, sd_notify and snapshot rule, and the package ``__init__`` files above them), with a
``__main__.py`` that calls :func:`edge.supervise.main.main`. The host needs only python3 and its
standard library: nothing else is in the file, and nothing else is importable from it.

Which modules go in is computed from the code, not listed: every ``import`` and ``from ... import``
of edge/supervise/, at any depth (inside functions too), followed through the ``edge`` modules it
reaches. An import of anything else that is not in the standard library fails the build, naming
the module and the line (pyproject.toml's import contract says the same before any build).

The file is deterministic: the same sources give the same bytes on any build host and at any
path. Its entries are sorted, stored (no compression: zlib's output may differ between
versions), dated 1980-01-01 00:00:00 (the earliest a zip can say), mode 0644, made on Unix;
the file itself is ``#!/usr/bin/python3`` followed by the archive, mode 0755, written to a
temporary name beside ``--out`` and renamed into place. No bytecode goes in: the interpreter
on the device may be another version than the build host's.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import sys
import zipfile
from pathlib import Path

__all__ = ["SHEBANG", "ENTRY", "closure", "build", "add_parser", "command"]

SHEBANG = b"#!/usr/bin/python3\n"
ENTRY = "edge.supervise"  # the package whose modules, and what they import of edge, make the file
DATE = (1980, 1, 1, 0, 0, 0)
MAIN = '''"""edge-supervise (built by `edge-bundle supervisor`; the source: edge/supervise/ of the edge checkout)."""

import sys

from edge.supervise.main import main

sys.exit(main())
'''


class ClosureError(RuntimeError):
    """The supervisor imports something that is neither the standard library nor a module of ``edge``."""


def _source_root() -> Path:
    import edge

    return Path(edge.__file__).resolve().parents[1]


def _module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """Every module ``path`` imports, at any depth: (name, line, whether it must be a module).
    ``from P import n`` names P, and P.n too, which is a module only when a file says so."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, True) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise ClosureError(f"{path}:{node.lineno}: a relative import; the supervisor's imports are absolute")
            found.append((node.module or "", node.lineno, True))
            found += [(f"{node.module}.{a.name}", node.lineno, False) for a in node.names if a.name != "*"]
    return found


def closure(root: Path | None = None) -> dict[str, Path]:
    """The files of the zipapp, by their name in it: every module of edge/supervise/, every module
    of ``edge`` those import (transitively), and the ``__init__.py`` of each package above them."""
    root = root or _source_root()
    package = root.joinpath(*ENTRY.split("."))
    todo = [ENTRY] + [f"{ENTRY}.{p.stem}" for p in sorted(package.glob("*.py")) if p.name != "__init__.py"]
    seen: set[str] = set()
    files: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(root, name)
        if path is None:
            raise ClosureError(f"{name}: no such module in {root}")
        files[path.relative_to(root).as_posix()] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages above it
        for imported, line, module in _imports(path):
            top = imported.split(".")[0]
            if top == "edge":
                if _module_file(root, imported) is not None:
                    todo.append(imported)
                elif module:
                    raise ClosureError(f"{path}:{line}: imports {imported}, which is not a module of edge")
            elif top not in sys.stdlib_module_names:
                raise ClosureError(f"{path}:{line}: imports {imported}, which is not in the standard library: "
                                   f"edge-supervise runs on the host's bare python3")
    return dict(sorted(files.items()))


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=DATE)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3  # Unix: the mode below is read
    info.external_attr = (0o100644 << 16)
    return info


def archive(root: Path | None = None) -> bytes:
    """The zipapp's bytes (shebang and archive)."""
    buf = io.BytesIO()
    buf.write(SHEBANG)
    entries = {"__main__.py": MAIN.encode(), **{n: p.read_bytes() for n, p in closure(root).items()}}
    with zipfile.ZipFile(buf, "w") as z:
        for name in sorted(entries):
            z.writestr(_entry(name), entries[name])
    return buf.getvalue()


def build(out: Path, root: Path | None = None) -> dict:
    """Write the zipapp to ``out`` (mode 0755, atomically); what was written."""
    data = archive(root)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names = z.namelist()
    return {"out": str(out), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "files": names}


# ------------------------------------------------------------------ edge-bundle supervisor


def add_parser(sub, epilog: str) -> None:
    s = sub.add_parser("supervisor", epilog=epilog,
                       help="build edge-supervise, the host's supervisor of the bundle, as one file (a zipapp that "
                            "needs only python3); install it at /usr/local/lib/edge/edge-supervise")
    s.add_argument("--out", required=True, type=Path, metavar="FILE",
                   help="the file to write (edge.service runs /usr/local/lib/edge/edge-supervise)")
    s.add_argument("--quiet", action="store_true")


def command(args) -> int:
    import json

    try:
        done = build(args.out)
    except ClosureError as exc:
        print(f"edge-bundle supervisor: {exc}", file=sys.stderr)
        return 3
    except OSError as exc:
        print(f"edge-bundle supervisor: cannot write {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(json.dumps({k: done[k] for k in ("out", "bytes", "sha256")} | {"files": len(done["files"])}))
    return 0
