"""What this horovodlite can do: Horovod's `*_built()` / `*_enabled()` queries."""

import importlib.util

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
]


def mpi_built() -> bool:
    """Return True: horovodlite always runs on MPI."""
    return True


def mpi_enabled() -> bool:
    """Return True: MPI is the only controller."""
    return True


def gloo_built() -> bool:
    """Return False: horovodlite has no Gloo backend."""
    return False


def gloo_enabled() -> bool:
    """Return False: horovodlite has no Gloo backend."""
    return False


def nccl_built() -> int:
    """Return 0: horovodlite has no NCCL backend (Horovod returns the NCCL version or 0)."""
    return 0


def ccl_built() -> bool:
    """Return False: horovodlite has no oneCCL backend."""
    return False


def ddl_built() -> bool:
    """Return False: horovodlite has no IBM DDL backend."""
    return False


def rocm_built() -> bool:
    """Return False: GPU support is CUDA through CuPy."""
    return False


def cuda_built() -> bool:
    """Return whether CuPy is installed, so GPU arrays can be used."""
    return importlib.util.find_spec("cupy") is not None
