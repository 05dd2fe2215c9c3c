"""What this horovodlite can do: Horovod's `*_built()` / `*_enabled()` queries, CUDA-aware MPI."""

import ctypes
import functools

from .buffers import cupy_installed
from .config import env_flag, env_value

__all__ = [
    "mpi_built",
    "mpi_enabled",
    "gloo_built",
    "gloo_enabled",
    "nccl_built",
    "ccl_built",
    "ddl_built",
    "rocm_built",
    "cuda_built",
    "cuda_aware_mpi",
]


def _fact(name: str, value, why: str):
    """Return Horovod's query `name`, which always answers `value` here (`why` says why)."""

    def query():
        return value

    query.__name__ = query.__qualname__ = name
    query.__doc__ = f"Return {value!r}: {why}."
    return query


# Horovod's backends that horovodlite has, or not: fixed answers.
mpi_built = _fact("mpi_built", True, "horovodlite always runs on MPI")
mpi_enabled = _fact("mpi_enabled", True, "MPI is the only controller")
gloo_built = _fact("gloo_built", False, "horovodlite has no Gloo backend")
gloo_enabled = _fact("gloo_enabled", False, "horovodlite has no Gloo backend")
nccl_built = _fact("nccl_built", 0, "no NCCL backend (Horovod returns the NCCL version or 0)")
ccl_built = _fact("ccl_built", False, "horovodlite has no oneCCL backend")
ddl_built = _fact("ddl_built", False, "horovodlite has no IBM DDL backend")
rocm_built = _fact("rocm_built", False, "GPU support is CUDA through CuPy")


def cuda_built() -> bool:
    """Return whether CuPy is installed, so GPU arrays can be used."""
    return cupy_installed()


def _mpi_library_handle():
    """Return a ctypes handle on the loaded MPI shared library, or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libmpi" in line.rsplit("/", 1)[-1]}
    except OSError:
        paths = set()
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


@functools.cache
def cuda_aware_mpi() -> bool:
    """Return whether the MPI library accepts GPU buffers.

    `HOROVODLITE_CUDA_AWARE_MPI=1` or `=0` overrides the library's own answer
    (`MPIX_Query_cuda_support`, exported by MPICH and Open MPI). Asked before init() too, so it
    reads its one setting itself, once.
    """
    override = env_value("CUDA_AWARE_MPI", None, env_flag)
    if override is not None:
        return override
    library = _mpi_library_handle()
    query = getattr(library, "MPIX_Query_cuda_support", None) if library is not None else None
    if query is None:
        return False
    query.restype = ctypes.c_int
    return bool(query())
