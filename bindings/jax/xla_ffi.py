"""A Python function as an XLA custom call on the CPU: collectives inside jax.jit without copies.

`jax.ffi.register_ffi_target` takes the address of a C function that XLA calls with a call
frame (xla/ffi/api/c_api.h, shipped in jaxlib's include folder). ctypes makes such a function of a
Python one: XLA calls it on the thread that runs the computation, ctypes takes the GIL, and the
function reads the frame's buffers as numpy arrays over XLA's own memory, so a collective reads
its inputs and writes its results where XLA keeps them. Every call site registers what it runs
(`register`) and passes the key as the call's one attribute; one target serves them all.

The call has no JAX effect: a computation with an effect (even an unordered one) leaves JAX's
C++ dispatch for its Python one, which costs more than a small all-reduce (docs/jax.md). The
price is that XLA orders the calls of one computation as it schedules them, not by program
order: host.py orders them with tokens.

Only the parts of the frame that a collective reads are described here; the layout is the
version-0 ABI that XLA keeps stable (fields are only added at the end of each struct).
"""

import ctypes
import functools
import itertools
import threading
from typing import Callable

import ml_dtypes
import numpy as np

import jax

__all__ = ["TARGET", "register", "used"]

TARGET = "horovodlite_host_call"

# XLA_FFI_DataType -> numpy
_DTYPES = {
    1: np.dtype(np.bool_),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.uint8),
    7: np.dtype(np.uint16),
    8: np.dtype(np.uint32),
    9: np.dtype(np.uint64),
    10: np.dtype(np.float16),
    11: np.dtype(np.float32),
    12: np.dtype(np.float64),
    15: np.dtype(np.complex64),
    16: np.dtype(ml_dtypes.bfloat16),
    18: np.dtype(np.complex128),
}
_METADATA_EXTENSION = 1
_STAGE_EXECUTE = 3
_ERROR_INTERNAL = 13
_API_VERSION = (0, 1)  # the oldest the runtime takes; nothing newer is used


class _Extension(ctypes.Structure):
    pass


_Extension._fields_ = [
    ("struct_size", ctypes.c_size_t),
    ("type", ctypes.c_int),
    ("next", ctypes.POINTER(_Extension)),
]


class _Struct(ctypes.Structure):
    """What most structs of the API begin with; a subclass's fields follow these."""

    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p)]


class _ApiVersion(_Struct):
    _fields_ = [("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class _Metadata(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("api_version", _ApiVersion),
        ("traits", ctypes.c_uint32),
    ]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _Extension), ("metadata", ctypes.POINTER(_Metadata))]


class _Buffer(_Struct):
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("rank", ctypes.c_int64),
        ("dims", ctypes.POINTER(ctypes.c_int64)),
    ]


class _Values(_Struct):  # XLA_FFI_Args and XLA_FFI_Rets share this layout
    _fields_ = [
        ("size", ctypes.c_int64),
        ("types", ctypes.POINTER(ctypes.c_int)),
        ("values", ctypes.POINTER(ctypes.POINTER(_Buffer))),
    ]


class _Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("value", ctypes.POINTER(ctypes.c_int64))]


class _Attrs(_Struct):
    _fields_ = [
        ("size", ctypes.c_int64),
        ("types", ctypes.c_void_p),
        ("names", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(ctypes.POINTER(_Scalar))),
    ]


class _CallFrame(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.POINTER(_Extension)),
        ("api", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
        ("stage", ctypes.c_int),
        ("args", _Values),
        ("rets", _Values),
        ("attrs", _Attrs),
    ]


class _ErrorCreateArgs(_Struct):
    _fields_ = [("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


_ErrorCreate = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ErrorCreateArgs))
# XLA_FFI_Api: struct_size, extension_start, api_version (24 bytes), internal_api, then
# XLA_FFI_Error_Create first among the function pointers.
_ERROR_CREATE_OFFSET = ctypes.sizeof(ctypes.c_size_t) + 2 * ctypes.sizeof(ctypes.c_void_p)
_ERROR_CREATE_OFFSET += ctypes.sizeof(_ApiVersion)

# key -> run(inputs, outputs): what each traced call site does on the host. An entry lives as
# long as the process, as an io_callback's function does: a compiled computation may run again.
_calls: dict = {}
_keys = itertools.count(1)
_lock = threading.Lock()


def _array(buffer: "_Buffer", readonly: bool) -> np.ndarray:
    """View an XLA buffer as a numpy array (no copy)."""
    dtype = _DTYPES[buffer.dtype]
    shape = tuple(buffer.dims[i] for i in range(buffer.rank))
    if not buffer.data:  # XLA passes no memory for an empty array
        return np.empty(shape, dtype)
    interface = {"data": (buffer.data, readonly), "shape": shape, "typestr": dtype.str}
    if dtype == ml_dtypes.bfloat16:  # numpy's typestr cannot name it: view 2-byte words
        interface["typestr"] = "<u2"
        return np.asarray(_Interface(interface)).view(dtype)
    return np.asarray(_Interface(interface))


class _Interface:
    __slots__ = ("__array_interface__",)

    def __init__(self, interface: dict):
        interface["version"] = 3
        self.__array_interface__ = interface


def _error(frame: "_CallFrame", exc: BaseException) -> int:
    """Return an XLA_FFI_Error that carries `exc`'s text (JAX raises a JaxRuntimeError, or a
    ValueError on its C++ dispatch, with it: host.collective_failure)."""
    create = ctypes.cast(
        ctypes.c_void_p.from_address(frame.api + _ERROR_CREATE_OFFSET).value, _ErrorCreate
    )
    args = _ErrorCreateArgs(
        ctypes.sizeof(_ErrorCreateArgs),
        None,
        f"{type(exc).__name__}: {exc}".encode(),
        _ERROR_INTERNAL,
    )
    return create(ctypes.byref(args))


def _handle(pointer) -> int:
    """The custom call itself: answer XLA's metadata query, run the call site's function."""
    frame = pointer.contents
    if frame.extension_start:
        extension = frame.extension_start.contents
        if extension.type == _METADATA_EXTENSION:
            metadata = ctypes.cast(
                frame.extension_start, ctypes.POINTER(_MetadataExtension)
            ).contents.metadata.contents
            metadata.api_version.major_version, metadata.api_version.minor_version = _API_VERSION
            metadata.traits = 0
            return None
    if frame.stage != _STAGE_EXECUTE:
        return None
    try:
        run = _calls[frame.attrs.attrs[0].contents.value[0]]
        args, rets = frame.args, frame.rets
        inputs = [_array(args.values[i].contents, True) for i in range(args.size)]
        outputs = [_array(rets.values[i].contents, False) for i in range(rets.size)]
        with _lock:  # should XLA ever run two at once, the core still sees one at a time
            run(inputs, outputs)
    except BaseException as exc:  # noqa: BLE001 (ctypes would print and drop it: hand it to XLA)
        return _error(frame, exc)
    return None


_HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_CallFrame))(_handle)


@functools.cache
def _register_target() -> None:
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    capsule = new_capsule(ctypes.cast(_HANDLER, ctypes.c_void_p), None, None)
    jax.ffi.register_ffi_target(TARGET, capsule, platform="cpu")


def register(run: Callable[[list, list], None]) -> int:
    """Return the key of a call site that runs `run(inputs, outputs)` (numpy views of XLA's
    buffers: read the inputs, write every output)."""
    _register_target()
    key = next(_keys)
    _calls[key] = run
    return key


def used() -> bool:
    """Return whether any call site was registered (a computation may call the target)."""
    return bool(_calls)
