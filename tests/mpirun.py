"""Launch a command under mpiexec with a hard timeout, so a hang fails a test instead of CI."""

import os
import shutil
import signal
import subprocess
import sys

__all__ = ["mpiexec_argv", "run_ranks", "benchmark_rows", "RANK_COUNTS"]

RANK_COUNTS = (1, 2, 3, 4)


def _mpiexec() -> str:
    # Prefer the mpiexec beside this Python (the mpich wheel puts it in the venv's bin).
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec found: pip install mpich (or install a system MPI)")
    return found


def mpiexec_argv(np: int) -> list:
    """Return the argv prefix that starts `np` ranks with the installed MPI launcher."""
    mpiexec = _mpiexec()
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        return [mpiexec, "--allow-run-as-root", "--oversubscribe", "-n", str(np)]
    return [mpiexec, "-n", str(np)]


def run_ranks(np: int, args: list, timeout: float = 180, env: dict = None):
    """Run `python -m mpi4py ARGS` on `np` ranks; return the CompletedProcess.

    `python -m mpi4py` aborts the whole job when one rank raises, so no rank waits forever;
    the timeout kills the launcher's whole process group if anything still hangs.
    """
    argv = mpiexec_argv(np) + [sys.executable, "-m", "mpi4py", *args]
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n*** killed after {timeout} s: the job hung ***"
        return subprocess.CompletedProcess(argv, -9, out)
    return subprocess.CompletedProcess(argv, proc.returncode, out)


def benchmark_rows(script: str, args: list, out, np: int = 2, timeout: float = 240) -> list:
    """Run benchmarks/`script` with `args` on `np` ranks, writing its JSON to `out`; return the
    JSON's rows (a smoke run: the job must succeed, its timings are not checked)."""
    import json
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / script
    result = run_ranks(np, [str(path), *args, "--out", str(out)], timeout=timeout)
    assert result.returncode == 0, result.stdout[-5000:]
    return json.loads(pathlib.Path(out).read_text())["rows"]
