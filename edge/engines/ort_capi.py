"""ONNX Runtime's C API through ctypes: just the calls the engine needs.

Why not the Python binding: ``InferenceSession`` accepts only a path or ``bytes``, and
``bytes`` is a copy of the model in anonymous memory (about 100 MiB and 400 ms for MiniLM).
The C API's ``CreateSessionFromArray`` takes a pointer, so the session can run on a
read-only file mapping with ``session.use_ort_model_bytes_directly`` and
``session.use_ort_model_bytes_for_initializers``: the weights stay in the page cache.

The C library ships in the wheel next to the Python extension
(``onnxruntime/capi/libonnxruntime.so.<version>``; onnxruntime-gpu has the same layout).
``OrtGetApiBase()`` returns ``{GetApi, GetVersionString}``; ``GetApi(n)`` returns the
``OrtApi`` table of function pointers, whose order is the ``ort_api_1_to_N`` initialiser in
``onnxruntime/core/session/onnxruntime_c_api.cc``. That table is append-only (old binaries
depend on it), so the indices below, transcribed for API versions 1..12, hold for every
later release. We ask for version 12 and check the library's version string and a few
calls whose results we can predict before trusting the table.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
from ctypes import POINTER, c_char_p, c_int, c_int64, c_size_t, c_uint32, c_void_p
from pathlib import Path

from edge.errors import EngineError, ErrorCode

__all__ = ["OrtLib", "OrtError", "load_library", "API_VERSION", "MIN_LIBRARY_VERSION", "TELEMETRY_ENV"]

API_VERSION = 12  # newest function we call: SessionOptionsAppendExecutionProvider (v12)
MIN_LIBRARY_VERSION = (1, 12)  # ORT 1.x ships API version x

# ONNX Runtime 1.29 and later start Microsoft's 1DS telemetry on Linux by default, in CreateEnv:
# a persistent device id and an SQLite event cache under $HOME/.cache/Microsoft/DeveloperTools
# (four fsyncs at each boot, measured with strace here), and an uploader that resolves
# mobile.events.data.microsoft.com while the runtime serves. An offline appliance does neither:
# the library reads this variable once, at its initialisation, so it is set before the library
# loads. An operator's own ORT_DISABLE_TELEMETRY (0 included) is left as it is.
TELEMETRY_ENV = "ORT_DISABLE_TELEMETRY"

# The OrtApi table, in order, API versions 1..12 (onnxruntime_c_api.cc, ort_api_1_to_N).
_TABLE = """
CreateStatus GetErrorCode GetErrorMessage
CreateEnv CreateEnvWithCustomLogger EnableTelemetryEvents DisableTelemetryEvents
CreateSession CreateSessionFromArray Run
CreateSessionOptions SetOptimizedModelFilePath CloneSessionOptions SetSessionExecutionMode
EnableProfiling DisableProfiling EnableMemPattern DisableMemPattern EnableCpuMemArena
DisableCpuMemArena SetSessionLogId SetSessionLogVerbosityLevel SetSessionLogSeverityLevel
SetSessionGraphOptimizationLevel SetIntraOpNumThreads SetInterOpNumThreads
CreateCustomOpDomain CustomOpDomain_Add AddCustomOpDomain RegisterCustomOpsLibrary
SessionGetInputCount SessionGetOutputCount SessionGetOverridableInitializerCount
SessionGetInputTypeInfo SessionGetOutputTypeInfo SessionGetOverridableInitializerTypeInfo
SessionGetInputName SessionGetOutputName SessionGetOverridableInitializerName
CreateRunOptions RunOptionsSetRunLogVerbosityLevel RunOptionsSetRunLogSeverityLevel
RunOptionsSetRunTag RunOptionsGetRunLogVerbosityLevel RunOptionsGetRunLogSeverityLevel
RunOptionsGetRunTag RunOptionsSetTerminate RunOptionsUnsetTerminate
CreateTensorAsOrtValue CreateTensorWithDataAsOrtValue IsTensor GetTensorMutableData
FillStringTensor GetStringTensorDataLength GetStringTensorContent
CastTypeInfoToTensorInfo GetOnnxTypeFromTypeInfo CreateTensorTypeAndShapeInfo SetTensorElementType
SetDimensions GetTensorElementType GetDimensionsCount GetDimensions GetSymbolicDimensions
GetTensorShapeElementCount GetTensorTypeAndShape GetTypeInfo GetValueType CreateMemoryInfo
CreateCpuMemoryInfo CompareMemoryInfo MemoryInfoGetName MemoryInfoGetId MemoryInfoGetMemType
MemoryInfoGetType AllocatorAlloc AllocatorFree AllocatorGetInfo GetAllocatorWithDefaultOptions
AddFreeDimensionOverride GetValue GetValueCount CreateValue CreateOpaqueValue GetOpaqueValue
KernelInfoGetAttribute_float KernelInfoGetAttribute_int64 KernelInfoGetAttribute_string
KernelContext_GetInputCount KernelContext_GetOutputCount KernelContext_GetInput KernelContext_GetOutput
ReleaseEnv ReleaseStatus ReleaseMemoryInfo ReleaseSession ReleaseValue ReleaseRunOptions
ReleaseTypeInfo ReleaseTensorTypeAndShapeInfo ReleaseSessionOptions ReleaseCustomOpDomain
GetDenotationFromTypeInfo CastTypeInfoToMapTypeInfo CastTypeInfoToSequenceTypeInfo GetMapKeyType
GetMapValueType GetSequenceElementType ReleaseMapTypeInfo ReleaseSequenceTypeInfo SessionEndProfiling
SessionGetModelMetadata ModelMetadataGetProducerName ModelMetadataGetGraphName ModelMetadataGetDomain
ModelMetadataGetDescription ModelMetadataLookupCustomMetadataMap ModelMetadataGetVersion ReleaseModelMetadata
CreateEnvWithGlobalThreadPools DisablePerSessionThreads CreateThreadingOptions ReleaseThreadingOptions
ModelMetadataGetCustomMetadataMapKeys AddFreeDimensionOverrideByName
GetAvailableProviders ReleaseAvailableProviders
GetStringTensorElementLength GetStringTensorElement FillStringTensorElement AddSessionConfigEntry
CreateAllocator ReleaseAllocator RunWithBinding CreateIoBinding ReleaseIoBinding BindInput BindOutput
BindOutputToDevice GetBoundOutputNames GetBoundOutputValues ClearBoundInputs ClearBoundOutputs TensorAt
CreateAndRegisterAllocator SetLanguageProjection SessionGetProfilingStartTimeNs
SetGlobalIntraOpNumThreads SetGlobalInterOpNumThreads SetGlobalSpinControl
AddInitializer CreateEnvWithCustomLoggerAndGlobalThreadPools SessionOptionsAppendExecutionProvider_CUDA
SessionOptionsAppendExecutionProvider_ROCM SessionOptionsAppendExecutionProvider_OpenVINO
SetGlobalDenormalAsZero CreateArenaCfg ReleaseArenaCfg
ModelMetadataGetGraphDescription SessionOptionsAppendExecutionProvider_TensorRT SetCurrentGpuDeviceId
GetCurrentGpuDeviceId
KernelInfoGetAttributeArray_float KernelInfoGetAttributeArray_int64 CreateArenaCfgV2 AddRunConfigEntry
CreatePrepackedWeightsContainer ReleasePrepackedWeightsContainer CreateSessionWithPrepackedWeightsContainer
CreateSessionFromArrayWithPrepackedWeightsContainer
SessionOptionsAppendExecutionProvider_TensorRT_V2 CreateTensorRTProviderOptions
UpdateTensorRTProviderOptions GetTensorRTProviderOptionsAsString ReleaseTensorRTProviderOptions
EnableOrtCustomOps RegisterAllocator UnregisterAllocator IsSparseTensor CreateSparseTensorAsOrtValue
FillSparseTensorCoo FillSparseTensorCsr FillSparseTensorBlockSparse CreateSparseTensorWithValuesAsOrtValue
UseCooIndices UseCsrIndices UseBlockSparseIndices GetSparseTensorFormat GetSparseTensorValuesTypeAndShape
GetSparseTensorValues GetSparseTensorIndicesTypeShape GetSparseTensorIndices
HasValue KernelContext_GetGPUComputeStream GetTensorMemoryInfo GetExecutionProviderApi
SessionOptionsSetCustomCreateThreadFn SessionOptionsSetCustomThreadCreationOptions
SessionOptionsSetCustomJoinThreadFn SetGlobalCustomCreateThreadFn SetGlobalCustomThreadCreationOptions
SetGlobalCustomJoinThreadFn SynchronizeBoundInputs SynchronizeBoundOutputs
SessionOptionsAppendExecutionProvider_CUDA_V2 CreateCUDAProviderOptions UpdateCUDAProviderOptions
GetCUDAProviderOptionsAsString ReleaseCUDAProviderOptions SessionOptionsAppendExecutionProvider_MIGraphX
AddExternalInitializers CreateOpAttr ReleaseOpAttr CreateOp InvokeOp ReleaseOp
SessionOptionsAppendExecutionProvider CopyKernelInfo ReleaseKernelInfo
""".split()
INDEX = {name: i for i, name in enumerate(_TABLE)}
# Guards against an edit slip; tests/engines/test_ort_capi.py checks entries behave as named.
assert len(_TABLE) == 219 and INDEX["ReleaseCustomOpDomain"] == 101 and INDEX["GetAvailableProviders"] == 125

_S = c_void_p  # OrtStatus* (NULL on success)
_PP = POINTER(c_void_p)
# name -> (restype, argtypes)
_SIGNATURES: dict[str, tuple] = {
    "CreateStatus": (_S, [c_int, c_char_p]),
    "GetErrorCode": (c_int, [_S]),
    "GetErrorMessage": (c_char_p, [_S]),
    "ReleaseStatus": (None, [_S]),
    "CreateEnv": (_S, [c_int, c_char_p, _PP]),
    "DisableTelemetryEvents": (_S, [c_void_p]),
    "ReleaseEnv": (None, [c_void_p]),
    "CreateSessionOptions": (_S, [_PP]),
    "ReleaseSessionOptions": (None, [c_void_p]),
    "AddSessionConfigEntry": (_S, [c_void_p, c_char_p, c_char_p]),
    "SetSessionGraphOptimizationLevel": (_S, [c_void_p, c_int]),
    "SetIntraOpNumThreads": (_S, [c_void_p, c_int]),
    "SetInterOpNumThreads": (_S, [c_void_p, c_int]),
    "EnableCpuMemArena": (_S, [c_void_p]),
    "DisableCpuMemArena": (_S, [c_void_p]),
    "SetSessionLogSeverityLevel": (_S, [c_void_p, c_int]),
    "CreateSessionFromArray": (_S, [c_void_p, c_void_p, c_size_t, c_void_p, _PP]),
    "ReleaseSession": (None, [c_void_p]),
    "SessionGetInputCount": (_S, [c_void_p, POINTER(c_size_t)]),
    "SessionGetOutputCount": (_S, [c_void_p, POINTER(c_size_t)]),
    "SessionGetInputName": (_S, [c_void_p, c_size_t, c_void_p, POINTER(c_char_p)]),
    "SessionGetOutputName": (_S, [c_void_p, c_size_t, c_void_p, POINTER(c_char_p)]),
    "GetAllocatorWithDefaultOptions": (_S, [_PP]),
    "AllocatorFree": (_S, [c_void_p, c_void_p]),
    "CreateCpuMemoryInfo": (_S, [c_int, c_int, _PP]),
    "ReleaseMemoryInfo": (None, [c_void_p]),
    "CreateTensorWithDataAsOrtValue": (_S, [c_void_p, c_void_p, c_size_t, POINTER(c_int64), c_size_t, c_int, _PP]),
    "ReleaseValue": (None, [c_void_p]),
    "Run": (_S, [c_void_p, c_void_p, POINTER(c_char_p), _PP, c_size_t, POINTER(c_char_p), c_size_t, _PP]),
    "GetAvailableProviders": (_S, [POINTER(POINTER(c_char_p)), POINTER(c_int)]),
    "ReleaseAvailableProviders": (_S, [POINTER(c_char_p), c_int]),
    "CreateCUDAProviderOptions": (_S, [_PP]),
    "UpdateCUDAProviderOptions": (_S, [c_void_p, POINTER(c_char_p), POINTER(c_char_p), c_size_t]),
    "SessionOptionsAppendExecutionProvider_CUDA_V2": (_S, [c_void_p, c_void_p]),
    "ReleaseCUDAProviderOptions": (None, [c_void_p]),
    "CreateTensorRTProviderOptions": (_S, [_PP]),
    "UpdateTensorRTProviderOptions": (_S, [c_void_p, POINTER(c_char_p), POINTER(c_char_p), c_size_t]),
    "SessionOptionsAppendExecutionProvider_TensorRT_V2": (_S, [c_void_p, c_void_p]),
    "ReleaseTensorRTProviderOptions": (None, [c_void_p]),
}

# Calls that may take long: ctypes releases the GIL around these (CFUNCTYPE), so the
# other threads run meanwhile. Every other call takes microseconds and keeps the GIL
# (PYFUNCTYPE): giving it up would cost a re-acquisition, and while another thread is
# busy in Python that waits up to the interpreter's switch interval (5 ms). Measured
# at boot: the warm-up's few runs made ~20 such calls each while the main thread was
# importing, and queued for the GIL on every one.
_RELEASES_GIL = frozenset({
    "CreateEnv", "CreateSessionFromArray", "Run", "ReleaseSession", "ReleaseEnv",
    "SessionOptionsAppendExecutionProvider_CUDA_V2", "SessionOptionsAppendExecutionProvider_TensorRT_V2",
})
assert _RELEASES_GIL <= set(_SIGNATURES)

# Enums of onnxruntime_c_api.h
LOGGING_WARNING, LOGGING_ERROR = 2, 3  # OrtLoggingLevel
ORT_DISABLE_ALL, ORT_ENABLE_BASIC, ORT_ENABLE_EXTENDED, ORT_ENABLE_ALL = 0, 1, 2, 99
TENSOR_FLOAT, TENSOR_INT64 = 1, 7  # ONNXTensorElementDataType
ALLOCATOR_DEVICE, ALLOCATOR_ARENA = 0, 1  # OrtAllocatorType
MEM_TYPE_DEFAULT = 0  # OrtMemType
ORT_INVALID_ARGUMENT = 2  # OrtErrorCode


class _ApiBase(ctypes.Structure):
    _fields_ = [
        ("GetApi", ctypes.CFUNCTYPE(c_void_p, c_uint32)),
        ("GetVersionString", ctypes.CFUNCTYPE(c_char_p)),
    ]


class OrtError(Exception):
    """A call of the C API returned a status; ``code`` is ORT's OrtErrorCode."""

    def __init__(self, call: str, code: int, message: str) -> None:
        super().__init__(f"{call}: {message} (OrtErrorCode {code})")
        self.call, self.code, self.message = call, code, message


def find_library() -> Path:
    """``$EDGE_ORT_LIBRARY``, else the C library inside the installed onnxruntime wheel."""
    from edge.config.env import ort_library_override

    explicit = ort_library_override()
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec("onnxruntime")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            "onnxruntime is not installed (no C library to load)",
            ErrorCode.ENGINE_UNAVAILABLE,
            stage="load_engine",
            setting="pip install 'edge[onnxruntime]' (onnxruntime-gpu built for L4T on a Jetson), "
                    "or set EDGE_ORT_LIBRARY to a libonnxruntime.so, or --engine torchscript",
        )
    capi = Path(list(spec.submodule_search_locations)[0]) / "capi"
    found = sorted(capi.glob("libonnxruntime.so*")) or sorted(capi.glob("libonnxruntime*.dylib"))
    if not found:
        raise EngineError(
            f"no libonnxruntime shared library in {capi}",
            ErrorCode.ENGINE_UNAVAILABLE,
            stage="load_engine",
            setting="EDGE_ORT_LIBRARY",
        )
    return found[-1]


class OrtLib:
    """The loaded library with typed entry points: ``lib.call("CreateEnv", ...)``."""

    def __init__(self, path: Path) -> None:
        os.environ.setdefault(TELEMETRY_ENV, "1")  # before the library initialises (TELEMETRY_ENV)
        try:
            self.dll = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LOCAL", 0))
            get_base = self.dll.OrtGetApiBase
        except (OSError, AttributeError) as exc:
            raise EngineError(f"cannot load ONNX Runtime C library {path}: {exc}", ErrorCode.ENGINE_UNAVAILABLE,
                              stage="load_engine", setting="EDGE_ORT_LIBRARY") from exc
        self.path = path
        get_base.restype = POINTER(_ApiBase)
        get_base.argtypes = []
        base = get_base().contents
        self.version = (base.GetVersionString() or b"").decode()
        m = re.match(r"(\d+)\.(\d+)", self.version)
        if not m or (int(m.group(1)), int(m.group(2))) < MIN_LIBRARY_VERSION:
            raise EngineError(
                f"ONNX Runtime C library {path.name} reports version {self.version!r}; "
                f"need >= {'.'.join(map(str, MIN_LIBRARY_VERSION))}",
                ErrorCode.ENGINE_UNAVAILABLE, stage="load_engine", setting="onnxruntime version",
            )
        api = base.GetApi(API_VERSION)
        if not api:
            raise EngineError(f"ONNX Runtime {self.version} does not offer C API version {API_VERSION}",
                              ErrorCode.ENGINE_UNAVAILABLE, stage="load_engine", setting="onnxruntime version")
        table = ctypes.cast(api, POINTER(c_void_p))
        self._fn = {}
        for name, (restype, argtypes) in _SIGNATURES.items():
            addr = table[INDEX[name]]
            if not addr:
                raise EngineError(f"ONNX Runtime {self.version}: C API entry {name} is NULL",
                                  ErrorCode.ENGINE_UNAVAILABLE, stage="load_engine")
            prototype = ctypes.CFUNCTYPE if name in _RELEASES_GIL else ctypes.PYFUNCTYPE
            self._fn[name] = prototype(restype, *argtypes)(addr)
        self._self_check()
        # The process-wide OrtEnv (ORT allows one): logging, schema registries, about 7 MiB of
        # anonymous memory whatever the model. Part of loading the library, like an import.
        env = c_void_p()
        self.call("CreateEnv", LOGGING_ERROR, b"edge", ctypes.byref(env))
        self.env = env

    def _self_check(self) -> None:
        # A wrong table would call the wrong functions; these have predictable results.
        status = self._fn["CreateStatus"](ORT_INVALID_ARGUMENT, b"edge self-check")
        ok = bool(status) and self._fn["GetErrorCode"](status) == ORT_INVALID_ARGUMENT
        ok = ok and self._fn["GetErrorMessage"](status) == b"edge self-check"
        if status:
            self._fn["ReleaseStatus"](status)
        if not ok or "CPUExecutionProvider" not in self.available_providers():
            raise EngineError(f"ONNX Runtime {self.version} C API table does not match the expected layout",
                              ErrorCode.ENGINE_UNAVAILABLE, stage="load_engine", setting="onnxruntime version")

    def call(self, name: str, *args) -> None:
        """Call an entry point that returns an OrtStatus*; raise OrtError on failure."""
        status = self._fn[name](*args)
        if status:
            code = self._fn["GetErrorCode"](status)
            message = (self._fn["GetErrorMessage"](status) or b"").decode(errors="replace")
            self._fn["ReleaseStatus"](status)
            raise OrtError(name, code, message)

    def release(self, name: str, handle) -> None:
        if handle:
            self._fn[name](handle)

    def available_providers(self) -> list[str]:
        arr = POINTER(c_char_p)()
        n = c_int()
        self.call("GetAvailableProviders", ctypes.byref(arr), ctypes.byref(n))
        try:
            return [arr[i].decode() for i in range(n.value)]
        finally:
            self.call("ReleaseAvailableProviders", arr, n)


_LIB: OrtLib | None = None


def load_library(path: str | os.PathLike | None = None) -> OrtLib:
    """Load (once per process) and check the ONNX Runtime C library."""
    global _LIB
    if _LIB is None:
        _LIB = OrtLib(Path(path) if path else find_library())
    return _LIB
