"""Map model files into memory without copying them.

Two shapes of mapping, both backed by the page cache, never by anonymous memory:

* :func:`map_file` (``edge/preload/mapping.py``, no numpy) maps a whole file read-only
  at an address a C library can use.
* :class:`WeightMap` maps a safetensors file copy-on-write (``MAP_PRIVATE``, writable, so
  numpy and torch accept the views without warnings) and exposes every tensor as a
  numpy view into the mapping. Pages stay file-backed as long as nobody writes them.

Only numpy and the standard library: no torch here.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import numpy as np

from edge.errors import ErrorCode, PackageError
from edge.preload.mapping import MappedFile, map_file

__all__ = ["MappedFile", "WeightMap", "map_file", "map_weights", "SAFETENSORS_DTYPES"]

# safetensors dtype tag -> numpy dtype (little-endian, as the format requires)
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

_MAX_HEADER = 100 * 1024 * 1024  # bytes; the safetensors reference reader's limit

class WeightMap:
    """Tensors of a safetensors file as numpy views into one copy-on-write mapping."""

    def __init__(self, path: Path, mm: mmap.mmap, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
        self.path = path
        self._mm = mm
        self.tensors = tensors  # name -> array view (no copy); insertion order = file order
        self.metadata = metadata
        self.nbytes = sum(t.nbytes for t in tensors.values())  # bytes of tensor data

    def __getitem__(self, name: str) -> np.ndarray:
        return self.tensors[name]

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def close(self) -> None:
        """Drop the views and unmap. Views still referenced elsewhere keep the mapping alive."""
        self.tensors = {}
        try:
            self._mm.close()
        except BufferError:
            pass  # exported views alive (e.g. torch tensors); the mapping goes with the last of them

    def __enter__(self) -> "WeightMap":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _bad(path: Path, why: str) -> PackageError:
    return PackageError(f"{path.name}: invalid safetensors file: {why}", ErrorCode.PACKAGE_INVALID, file=path.name)


def map_weights(path: str | os.PathLike, *, alignment: int = 1) -> WeightMap:
    """Map a safetensors file; every tensor becomes a numpy view into the mapping.

    ``alignment`` (bytes) is checked for every tensor's absolute offset; the package
    writer aligns to 64 so the views are SIMD- and cache-line aligned.
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError as exc:
        raise PackageError(f"cannot map {path.name}: not found", ErrorCode.PACKAGE_FILE_MISSING,
                           file=path.name) from exc
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise _bad(path, "shorter than its header length")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    (hlen,) = struct.unpack_from("<Q", mm, 0)
    if hlen > _MAX_HEADER or 8 + hlen > size:
        mm.close()
        raise _bad(path, f"header length {hlen} exceeds the file")
    try:
        header = json.loads(bytes(mm[8 : 8 + hlen]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        mm.close()
        raise _bad(path, f"header is not JSON ({exc})") from exc
    base = 8 + hlen
    data_len = size - base
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, np.ndarray] = {}
    try:
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            dtype = SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise _bad(path, f"tensor {name!r} has unsupported dtype {info['dtype']}")
            start, end = info["data_offsets"]
            shape = tuple(int(d) for d in info["shape"])
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if not (0 <= start <= end <= data_len) or end - start != count * dtype.itemsize:
                raise _bad(path, f"tensor {name!r} offsets {start}..{end} do not fit shape {shape} / file")
            if (base + start) % alignment:
                raise _bad(path, f"tensor {name!r} is not {alignment}-byte aligned")
            tensors[name] = np.frombuffer(mm, dtype=dtype, count=count, offset=base + start).reshape(shape)
    except PackageError:
        tensors.clear()
        mm.close()
        raise
    except (KeyError, TypeError, ValueError) as exc:
        tensors.clear()
        mm.close()
        raise _bad(path, f"malformed header entry ({exc})") from exc
    return WeightMap(path, mm, tensors, metadata)
