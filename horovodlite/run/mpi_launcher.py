"""Find the installed MPI launcher, tell MPICH's Hydra from Open MPI, and build its command line.

Settings travel to every rank as environment variables, named on the launcher's command line
(`-genv NAME VALUE` for Hydra, `-x NAME=VALUE` for Open MPI) so they reach remote hosts too. The
command is an argv list: nothing here passes through a shell.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

from .errors import LaunchError
from .hosts import hosts_argument

__all__ = [
    "HYDRA",
    "OPEN_MPI",
    "FLAVOUR_NAMES",
    "build_command",
    "detect_flavour",
    "find_mpiexec",
    "flavour_of",
    "settings_env",
    "srun_command",
]

HYDRA, OPEN_MPI = "hydra", "openmpi"
FLAVOUR_NAMES = {HYDRA: "MPICH Hydra", OPEN_MPI: "Open MPI"}

# Open MPI forwards only the variables named with -x; these make a venv work on remote hosts.
_OPEN_MPI_FORWARDED = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
_INSTALL_HINT = "pip install 'horovodlite[mpich]' (MPICH from PyPI) or install MPICH or Open MPI"


def find_mpiexec(environ: dict | None = None) -> str:
    """Return the launcher to use: $HOROVODLITE_MPIEXEC, the one beside this Python, or PATH's.

    Raises:
        LaunchError: none is installed, or $HOROVODLITE_MPIEXEC names no executable.
    """
    environ = os.environ if environ is None else environ
    chosen = environ.get("HOROVODLITE_MPIEXEC")
    if chosen:
        found = shutil.which(chosen, path=environ.get("PATH"))
        if found is None:
            raise LaunchError(
                f"HOROVODLITE_MPIEXEC={chosen} is not an executable: point it at mpiexec or "
                f"unset it"
            )
        return found
    # The mpich wheel installs mpiexec beside the venv's python, which may not be on PATH.
    for name in ("mpiexec", "mpirun"):
        beside = os.path.join(os.path.dirname(sys.executable), name)
        if os.access(beside, os.X_OK):
            return beside
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name, path=environ.get("PATH"))
        if found is not None:
            return found
    raise LaunchError(
        f"no mpiexec or mpirun found beside {sys.executable} or on PATH: {_INSTALL_HINT}"
    )


def flavour_of(version_text: str) -> str:
    """Return HYDRA or OPEN_MPI from the output of `mpiexec --version`.

    Raises:
        LaunchError: the text is neither's.
    """
    if "Open MPI" in version_text or "OpenRTE" in version_text or "PRRTE" in version_text:
        return OPEN_MPI
    if "HYDRA" in version_text or "Hydra" in version_text:
        return HYDRA
    first = version_text.strip().splitlines()[0] if version_text.strip() else "(no output)"
    raise LaunchError(
        f"unknown MPI launcher (--version says {first!r}): horovodlite-run drives MPICH's Hydra "
        f"and Open MPI; set HOROVODLITE_MPIEXEC to one of them, or run your mpiexec directly"
    )


def detect_flavour(mpiexec: str) -> str:
    """Run `mpiexec --version` and return HYDRA or OPEN_MPI."""
    try:
        result = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"cannot run {mpiexec} --version: {exc}") from None
    return flavour_of(result.stdout + result.stderr)


def settings_env(
    fusion_threshold_mb: float | None = None,
    cycle_time_ms: float | None = None,
    timeline_filename: str | None = None,
    stall_check_time: float | None = None,
) -> dict:
    """Return the HOROVODLITE_* variables for the settings given (None leaves one unset).

    Raises:
        ValueError: a negative size or time.
    """
    env = {}
    for flag, value in (("--fusion-threshold-mb", fusion_threshold_mb),
                        ("--cycle-time-ms", cycle_time_ms),
                        ("--stall-check-time", stall_check_time)):  # fmt: skip
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{flag} must be a non-negative number, got {value}")
    if fusion_threshold_mb is not None:
        env["HOROVODLITE_FUSION_THRESHOLD"] = str(int(fusion_threshold_mb * 1024 * 1024))
    if cycle_time_ms is not None:
        env["HOROVODLITE_CYCLE_TIME"] = f"{cycle_time_ms:g}"
    if timeline_filename is not None:
        if not timeline_filename:
            raise ValueError("--timeline-filename must not be empty")
        env["HOROVODLITE_TIMELINE"] = os.path.abspath(timeline_filename)
    if stall_check_time is not None:
        env["HOROVODLITE_STALL_CHECK_TIME_SECONDS"] = f"{stall_check_time:g}"
    return env


def build_command(
    flavour: str,
    mpiexec: str,
    np: int,
    hosts: list,
    command: list,
    settings: dict | None = None,
    mpi_args: list | None = None,
    as_root: bool | None = None,
) -> list:
    """Return the launcher argv that runs `command` on `np` processes over `hosts`.

    Args:
        flavour: HYDRA or OPEN_MPI.
        hosts: Host entries; processes fill each host's slots in order.
        settings: variables every rank gets (see settings_env()).
        mpi_args: extra launcher arguments, inserted before the command.
        as_root: whether to let Open MPI run as root (default: whether we are root).
    """
    if not command:
        raise ValueError("no command to run: e.g. horovodlite-run -np 2 python train.py")
    settings = settings or {}
    mpi_args = list(mpi_args or [])
    if flavour == HYDRA:
        argv = [mpiexec, "-n", str(np), "-hosts", hosts_argument(hosts)]
        for name, value in settings.items():
            argv += ["-genv", name, value]
    elif flavour == OPEN_MPI:
        if as_root is None:
            as_root = hasattr(os, "geteuid") and os.geteuid() == 0
        argv = [mpiexec] + (["--allow-run-as-root"] if as_root else [])
        # Binding each rank to one core would starve the engine's background thread.
        argv += ["-np", str(np), "-H", hosts_argument(hosts), "--bind-to", "none",
                 "--map-by", "slot"]  # fmt: skip
        for name, value in settings.items():
            argv += ["-x", f"{name}={value}"]
        for name in _OPEN_MPI_FORWARDED:
            if name in os.environ and name not in settings:
                argv += ["-x", name]
    else:
        raise ValueError(f"unknown MPI flavour {flavour!r}: expected {HYDRA!r} or {OPEN_MPI!r}")
    return argv + mpi_args + list(command)


def srun_command(np: int, command: list, mpi_args: list | None = None, environ=None) -> list:
    """Return the argv that starts `command` as `np` tasks of the current Slurm job with srun.

    The ranks find each other through Slurm's PMI-2 server (`--mpi=pmi2`), which MPICH's PMI
    client speaks; settings reach them in the environment srun passes on. `mpi_args` come
    after the defaults, so `--mpi=pmix` there replaces them.

    Raises:
        LaunchError: srun is not installed.
    """
    if not command:
        raise ValueError("no command to run: e.g. horovodlite-run --launcher srun python train.py")
    environ = os.environ if environ is None else environ
    srun = shutil.which("srun", path=environ.get("PATH"))
    if srun is None:
        raise LaunchError("--launcher srun: no srun on PATH: run inside a Slurm job's shell")
    # A rank that fails ends the step at once rather than leaving the others waiting.
    return [srun, f"--ntasks={np}", "--mpi=pmi2", "--kill-on-bad-exit=1",
            *(mpi_args or []), *command]  # fmt: skip
