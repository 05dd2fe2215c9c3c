"""Array handling: which arrays are accepted, their MPI wire types, and GPU detection.

Host arrays are numpy arrays (or anything numpy can view). GPU arrays are CuPy arrays or any
object exposing `__cuda_array_interface__` or a CUDA DLPack device; they are viewed as CuPy
arrays, so reductions on them run on the GPU (staging.py moves them through host memory when the
MPI library is not CUDA-aware).
"""

import functools
import importlib.util
import sys

import ml_dtypes
import numpy as np
from mpi4py import MPI

__all__ = [
    "DTYPE_NAMES",
    "DTYPES_BY_NAME",
    "SUPPORTED_DTYPES",
    "as_array",
    "cupy_holds",
    "cupy_installed",
    "is_cupy_array",
    "array_module",
    "device_module",
    "native_mpi_type",
    "synchronize_device",
    "wire_type",
]

# Dtypes every collective accepts. bool is data movement plus Sum/Min/Max/Product (or/and).
SUPPORTED_DTYPES = frozenset(
    np.dtype(t)
    for t in (
        np.uint8,
        np.int8,
        np.uint16,
        np.int16,
        np.uint32,
        np.int32,
        np.uint64,
        np.int64,
        np.float16,
        ml_dtypes.bfloat16,
        np.float32,
        np.float64,
        np.bool_,
    )
)

# str(dtype) costs microseconds; collectives name dtypes on every call.
DTYPE_NAMES = {dtype: str(dtype) for dtype in SUPPORTED_DTYPES}
DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}

# MPI datatypes the MPI library can reduce itself. float16, bfloat16 and bool have none that
# every MPI supports, so the native algorithm reduces them with a user-defined op instead.
_NATIVE_MPI_TYPE = {
    np.dtype(np.uint8): MPI.UINT8_T,
    np.dtype(np.int8): MPI.INT8_T,
    np.dtype(np.uint16): MPI.UINT16_T,
    np.dtype(np.int16): MPI.INT16_T,
    np.dtype(np.uint32): MPI.UINT32_T,
    np.dtype(np.int32): MPI.INT32_T,
    np.dtype(np.uint64): MPI.UINT64_T,
    np.dtype(np.int64): MPI.INT64_T,
    np.dtype(np.float32): MPI.FLOAT,
    np.dtype(np.float64): MPI.DOUBLE,
}

# Moving data needs no arithmetic: an unsigned integer type of the same width carries any dtype.
_WIRE_TYPE = {1: MPI.UINT8_T, 2: MPI.UINT16_T, 4: MPI.UINT32_T, 8: MPI.UINT64_T}

_CUDA_DLPACK_DEVICES = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def wire_type(dtype: np.dtype) -> MPI.Datatype:
    """Return the MPI datatype that moves elements of `dtype` bit for bit."""
    return _WIRE_TYPE[dtype.itemsize]


def native_mpi_type(dtype: np.dtype):
    """Return the MPI datatype the MPI library can reduce for `dtype`, or None."""
    return _NATIVE_MPI_TYPE.get(dtype)


def is_cupy_array(obj) -> bool:
    """Return whether `obj` is a CuPy array (without importing CuPy: only if it is loaded).

    Asked before `__cuda_array_interface__`, a dictionary a CuPy array builds on each read.
    """
    cupy = sys.modules.get("cupy")
    return cupy is not None and type(obj) is cupy.ndarray


def _is_gpu_object(obj) -> bool:
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    return dlpack_device is not None and dlpack_device()[0] in _CUDA_DLPACK_DEVICES


def as_array(obj):
    """View `obj` as a numpy or CuPy array without copying where possible.

    Raises:
        TypeError: `obj` is not an array, or its dtype is not supported.
    """
    if isinstance(obj, np.ndarray) or is_cupy_array(obj):
        array = obj
    elif _is_gpu_object(obj):
        import cupy  # only GPU users need CuPy

        # CuPy honours the producer's stream (CUDA array interface v3, DLPack `stream=`).
        array = (
            cupy.asarray(obj)
            if hasattr(obj, "__cuda_array_interface__")
            else (cupy.from_dlpack(obj))
        )
    else:
        try:
            array = np.asarray(obj)
        except Exception as exc:
            raise TypeError(
                f"expected an array (numpy, CuPy, or anything with the buffer protocol, "
                f"__cuda_array_interface__ or DLPack), got {type(obj).__name__}"
            ) from exc
    if array.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(sorted(DTYPE_NAMES.values()))
        raise TypeError(f"dtype {array.dtype} is not supported: use one of {names}")
    return array


def array_module(array):
    """Return numpy or cupy, whichever owns `array`."""
    if isinstance(array, np.ndarray):
        return np
    import cupy

    return cupy


def device_module(device: str):
    """Return numpy for "cpu" (the agreed fields' device), else cupy."""
    if device == "cpu":
        return np
    import cupy

    return cupy


def cupy_holds(dtype: np.dtype) -> bool:
    """Return whether a CuPy array can hold GPU data of `dtype` here: CuPy is installed, and
    the dtype is not bfloat16 (CuPy has none)."""
    return dtype != _BFLOAT16 and cupy_installed()


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


@functools.cache
def cupy_installed() -> bool:
    """Return whether CuPy is installed (asked once: the answer holds for the process)."""
    return importlib.util.find_spec("cupy") is not None


def synchronize_device(xp) -> None:
    """Wait for the current CUDA stream, so MPI reads finished data."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
