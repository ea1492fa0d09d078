"""NVML on a discrete GPU, through ctypes and the driver's ``libnvidia-ml.so.1``.

No Python dependency: the library comes with the NVIDIA driver, and where it does not load
(no driver, a CPU-only machine) the source reports why and stays off. On a Jetson NVML is not
used: the integrated GPU is read from its devfreq node (:func:`edge.observability.telemetry.sysfs.read_gpu`).

The functions and structs are NVML's stable C API (nvml.h): ``nvmlInit_v2``,
``nvmlDeviceGetCount_v2``, ``nvmlDeviceGetHandleByIndex_v2``, ``nvmlDeviceGetName``,
``nvmlDeviceGetUtilizationRates`` (percent over the driver's last sample period),
``nvmlDeviceGetMemoryInfo`` (bytes), ``nvmlDeviceGetTemperature`` (sensor 0: the GPU die, °C),
``nvmlDeviceGetPowerUsage`` (mW), ``nvmlDeviceGetClockInfo`` (clock 0: graphics, MHz). A call
that fails leaves its field ``None`` (many are unsupported on one board or another).
NVML is initialised once, on the sampler's thread, and kept.
"""

from __future__ import annotations

import ctypes
from typing import Any

__all__ = ["NvmlSource", "LIBRARY"]

LIBRARY = "libnvidia-ml.so.1"
_SUCCESS = 0
_TEMPERATURE_GPU = 0
_CLOCK_GRAPHICS = 0


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlSource:
    """Per GPU: name, load, memory, temperature, power and graphics clock."""

    def __init__(self, library: str = LIBRARY, loader=None) -> None:
        self.library = library
        self._loader = loader or ctypes.CDLL  # tests pass a fake
        self.status = "not tried yet"
        self._lib: Any = None  # once open: the loader's library (a ctypes.CDLL, or a test's fake)
        self._handles: list = []
        self._tried = False

    def read(self) -> list[dict] | None:
        """One dict per GPU, or None with the reason in :attr:`status`."""
        if not self._tried:
            self._tried = True
            self._open()
        if self._lib is None:
            return None
        return [self._device(i, h) for i, h in enumerate(self._handles)]

    def close(self) -> None:
        lib, self._lib = self._lib, None
        if lib is not None:
            try:
                lib.nvmlShutdown()
            except Exception:
                pass

    def _error(self, lib, code: int) -> str:
        try:
            fn = lib.nvmlErrorString
            if hasattr(fn, "restype"):  # a C function: it returns a string, not an int
                fn.restype = ctypes.c_char_p
            text = fn(code)
            return text.decode(errors="replace") if isinstance(text, bytes) and text else f"error {code}"
        except Exception:
            return f"error {code}"

    def _open(self) -> None:
        try:
            lib = self._loader(self.library)
        except OSError as exc:
            self.status = f"{self.library} does not load (no NVIDIA driver here): {exc}"[:200]
            return
        try:
            code = lib.nvmlInit_v2()
            if code != _SUCCESS:
                self.status = f"nvmlInit_v2: {self._error(lib, code)}"
                return
            count = ctypes.c_uint(0)
            code = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
            if code != _SUCCESS:
                self.status = f"nvmlDeviceGetCount_v2: {self._error(lib, code)}"
                return
            for i in range(count.value):
                handle = ctypes.c_void_p()
                if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(handle)) == _SUCCESS:
                    self._handles.append(handle)
        except AttributeError as exc:  # a library without these symbols
            self.status = f"{self.library}: {exc}"[:200]
            return
        if not self._handles:
            self.status = "NVML found no GPU"
            return
        self._lib = lib
        self.status = "ok"

    def _device(self, index: int, handle) -> dict:
        lib = self._lib
        out: dict = {"index": index, "name": None, "load_pct": None, "memory_load_pct": None,
                     "memory_total_bytes": None, "memory_used_bytes": None, "temp_c": None, "power_w": None,
                     "clock_mhz": None}
        name = ctypes.create_string_buffer(96)
        if lib.nvmlDeviceGetName(handle, name, ctypes.c_uint(96)) == _SUCCESS:
            out["name"] = name.value.decode(errors="replace")
        util = _Utilization()
        if lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)) == _SUCCESS:
            out["load_pct"], out["memory_load_pct"] = float(util.gpu), float(util.memory)
        mem = _Memory()
        if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == _SUCCESS:
            out["memory_total_bytes"], out["memory_used_bytes"] = int(mem.total), int(mem.used)
        value = ctypes.c_uint(0)
        if lib.nvmlDeviceGetTemperature(handle, ctypes.c_int(_TEMPERATURE_GPU), ctypes.byref(value)) == _SUCCESS:
            out["temp_c"] = float(value.value)
        if lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(value)) == _SUCCESS:
            out["power_w"] = value.value / 1000.0
        if lib.nvmlDeviceGetClockInfo(handle, ctypes.c_int(_CLOCK_GRAPHICS), ctypes.byref(value)) == _SUCCESS:
            out["clock_mhz"] = int(value.value)
        return out
