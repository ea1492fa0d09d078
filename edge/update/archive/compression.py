"""The archive's compression: zstd (the default) or xz, told apart by their magic bytes.

Why zstd, with a 128 MiB window and long-distance matching: docs/archive.md ("Which
compression and why") has the measurements. In short, on the 400 MB MiniLM ORT bundle, zstd
packs 3x faster than xz decompresses, and unpacks 25x faster, for an archive the same size:
the model's three copies of its weights (model.onnx, model.ort, weights.safetensors, ~90 MB
apart in the stream) match only within a window that reaches back past one of them.

Reading is the installer's side, before the signature is checked, so it bounds what a hostile
stream can cost: zstd is fed 4 KiB of input per call (a zstd block expands at most ~32,000x,
so no call returns more than ~128 MiB), xz is asked for bounded output; the window is zstd's
default limit (128 MiB). ``finish`` insists that the stream ends exactly: one complete frame
(whose checksum the decompressor checks), nothing after it.
"""

from __future__ import annotations

import lzma
from typing import BinaryIO

from edge.update.archive.errors import MemberError

__all__ = ["COMPRESSIONS", "DEFAULT_COMPRESSION", "ZSTD_LEVEL", "ZSTD_WINDOW_LOG", "detect", "compressing_writer",
           "DecompressingReader"]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
XZ_MAGIC = b"\xfd7zXZ\x00"
COMPRESSIONS = ("zstd", "xz")
DEFAULT_COMPRESSION = "zstd"
ZSTD_LEVEL = 9  # 3: 2% larger, 3 s less to pack; 19: 0.6% smaller, 230 s more (docs/archive.md)
ZSTD_WINDOW_LOG = 27  # 128 MiB: reaches the previous copy of the weights; zstd's default decoder limit
XZ_DICT = 192 << 20  # bytes; xz's presets stop at 64 MiB, short of the weights' distance
_ZSTD_FEED = 4096  # compressed bytes per decompress call (see the module docstring)
_XZ_MAX_OUT = 4 << 20  # decompressed bytes per decompress call
_RAW_READ = 1 << 20


def _zstandard():
    try:
        import zstandard
    except ImportError as exc:
        raise ImportError("zstd needs the zstandard module: pip install 'edge[archive]'", name="zstandard") from exc
    return zstandard


def detect(head: bytes) -> str:
    """The compression whose magic ``head`` starts with; MemberError for anything else."""
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(XZ_MAGIC):
        return "xz"
    raise MemberError("not a bundle archive: it is neither zstd- nor xz-compressed (its first bytes are "
                      f"{head[:6].hex()})")


def compressing_writer(raw: BinaryIO, kind: str = DEFAULT_COMPRESSION, *, level: int | None = None):
    """A writable file object that compresses into ``raw``; closing it ends the frame (not ``raw``).

    Single-threaded: the sizes and times in docs/archive.md are one core's, like a Jetson's pack
    would be, and the output does not depend on the host's core count.
    """
    if kind == "zstd":
        zstandard = _zstandard()
        params = zstandard.ZstdCompressionParameters.from_level(
            ZSTD_LEVEL if level is None else level, window_log=ZSTD_WINDOW_LOG, enable_ldm=True,
            write_checksum=True, threads=0)
        return zstandard.ZstdCompressor(compression_params=params).stream_writer(raw, closefd=False)
    if kind == "xz":
        return lzma.LZMAFile(raw, "wb", format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, filters=[
            {"id": lzma.FILTER_LZMA2, "preset": 6 if level is None else level, "dict_size": XZ_DICT}])
    raise ValueError(f"compression must be one of {COMPRESSIONS}, not {kind!r}")


class DecompressingReader:
    """``read(n)`` of the decompressed stream of ``raw``; ``finish()`` checks that it ended exactly.

    ``compressed_bytes`` and ``decompressed_bytes`` count what went through (for throughput).
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        head = raw.read(len(XZ_MAGIC))
        self.kind = detect(head)
        if self.kind == "zstd":
            self._dec = _zstandard().ZstdDecompressor().decompressobj()
        else:
            self._dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        self._pending = memoryview(head)  # compressed bytes not yet fed
        self._out = bytearray()
        self._raw_eof = False
        self.compressed_bytes = len(head)
        self.decompressed_bytes = 0

    @property
    def _ended(self) -> bool:
        return self._dec.eof

    def _feed(self) -> bool:
        """Decompress a little more into ``_out``; False when the frame has ended."""
        if self._ended:
            return False
        if not self._pending and not self._raw_eof:
            chunk = self._raw.read(_RAW_READ)
            self.compressed_bytes += len(chunk)
            if chunk:
                self._pending = memoryview(chunk)
            else:
                self._raw_eof = True
        try:
            if self.kind == "zstd":
                if not self._pending:
                    raise MemberError("the archive is truncated: its compressed stream stops before its end")
                piece, self._pending = self._pending[:_ZSTD_FEED], self._pending[_ZSTD_FEED:]  # views: no copy
                out = self._dec.decompress(piece)
            else:
                if not self._pending and self._dec.needs_input:
                    raise MemberError("the archive is truncated: its compressed stream stops before its end")
                out = self._dec.decompress(self._pending, max_length=_XZ_MAX_OUT)
                self._pending = memoryview(b"")
        except MemberError:
            raise
        except Exception as exc:  # zstandard.ZstdError, lzma.LZMAError: corrupted
            raise MemberError(f"the archive is corrupted: {self.kind}: {exc}") from None
        self._out += out
        self.decompressed_bytes += len(out)
        return True

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self._out) < n) and self._feed():
            pass
        if n < 0 or n >= len(self._out):
            data, self._out = bytes(self._out), bytearray()
        else:
            data = bytes(self._out[:n])
            del self._out[:n]
        return data

    def finish(self, max_padding: int = 1 << 20) -> None:
        """Read to the end: only zero bytes may remain (tar's end blocks and record padding),
        the frame must be complete (its checksum checked) and nothing may follow it."""
        seen = 0
        while True:
            data = self.read(1 << 16)
            if not data:
                break
            seen += len(data)
            if data.count(0) != len(data) or seen > max_padding:
                raise MemberError("the archive holds data after the end of its tar stream")
        if not self._ended:
            raise MemberError("the archive is truncated: its compressed stream stops before its end")
        unused = self._dec.unused_data + bytes(self._pending)
        if unused or self._raw.read(1):
            raise MemberError(f"the archive has bytes after its {self.kind} stream")
