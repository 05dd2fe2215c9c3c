"""`horovodlite-run --check-build`: what this installation can do."""

from __future__ import annotations

import importlib

from .errors import LaunchError
from .mpi_launcher import FLAVOUR_NAMES, detect_flavour, find_mpiexec

__all__ = ["FRAMEWORKS", "build_report"]

FRAMEWORKS = ("torch", "tensorflow", "keras", "pytorch_lightning", "cupy")


def _importable(module: str) -> tuple:
    """Return (True, version) if `module` imports, else (False, why not)."""
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # a broken install raises more than ImportError
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return True, str(getattr(imported, "__version__", "version unknown"))


def _mpi_facts() -> tuple:
    from mpi4py import MPI

    from ..runtime import cuda_aware_mpi

    library = " ".join(MPI.Get_library_version().split("\n", 1)[0].split())
    major, minor = MPI.Get_version()
    # MPIX_Query_cuda_support aborts MPICH when called before MPI_Init.
    cuda = ("yes" if cuda_aware_mpi() else "no") if MPI.Is_initialized() else "unknown"
    return f"{library} (MPI {major}.{minor})", cuda


def _launcher() -> str:
    try:
        mpiexec = find_mpiexec()
        return f"{mpiexec} ({FLAVOUR_NAMES[detect_flavour(mpiexec)]})"
    except LaunchError as exc:
        return f"none usable: {exc}"


def _transports() -> list:
    """Return the report's lines on transports: what moves host and GPU buffers, what exists."""
    from ..config import Settings
    from ..transport import describe_choice

    try:
        importlib.import_module("horovodlite.torch")  # registers torch.distributed's gloo, nccl
    except Exception:  # no torch, or a broken one: the frameworks list says why
        pass
    try:
        choice = describe_choice(Settings.from_environment())
    except ValueError as exc:
        return [f"Transports:      none: {exc}"]
    return [
        f"Transports (HOROVODLITE_TRANSPORT={choice['setting']}):",
        f"    host buffers:  {choice['host']}",
        f"    GPU buffers:   {choice['gpu']}",
        f"    available:     {', '.join(choice['available'])}",
    ]


def _allocation() -> str:
    from .allocation import detect_allocation

    try:
        allocation = detect_allocation()
    except (ValueError, OSError) as exc:
        return f"unreadable: {exc}"
    if allocation is None:
        return "none (not inside a Slurm, PBS, LSF or Kubernetes MPI Operator job)"
    return allocation.describe()


def build_report() -> str:
    """Return the --check-build text: version, MPI, CUDA-awareness, transports, frameworks."""
    from ..version import __version__

    library, cuda = _mpi_facts()
    lines = [
        f"horovodlite v{__version__}:",
        "",
        f"MPI library:     {library}",
        f"CUDA-aware MPI:  {cuda}",
        f"Launcher:        {_launcher()}",
        f"Scheduler:       {_allocation()}",
        "",
        *_transports(),
        "",
        "Available frameworks:",
    ]
    for module in FRAMEWORKS:
        ok, detail = _importable(module)
        lines.append(f"    [{'X' if ok else ' '}] {module} ({detail})")
    return "\n".join(lines)
