"""Parameter-server jobs where a rank dies (hvd.ps): run under `mpiexec -disable-auto-cleanup`.

MPICH's launcher ends the whole job when one rank exits without MPI_Finalize unless told not
to; with that flag the surviving ranks go on, which is what a dying worker needs. Open MPI has
no such switch here: these tests run with MPICH's Hydra only.
"""

import os
import pathlib
import signal
import subprocess
import sys

import pytest
from mpirun import mpiexec_argv

pytest.importorskip("torch")
JOBS = pathlib.Path(__file__).parent / "jobs"


def run_surviving(np: int, script: str, *args, timeout: float = 180) -> str:
    """Run a job script whose ranks may die; return its output (all ranks)."""
    argv = mpiexec_argv(np)
    if "-n" != argv[1]:
        pytest.skip("needs MPICH's Hydra launcher (-disable-auto-cleanup)")
    argv = [argv[0], "-disable-auto-cleanup", *argv[1:], sys.executable, str(JOBS / script), *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0] + f"\n*** killed after {timeout} s: the job hung ***"
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("np, servers, staleness", [(3, 1, "none"), (4, 1, "1"), (4, 2, "0")])
def test_a_worker_that_dies_leaves_the_job_running(np, servers, staleness):
    out = run_surviving(np, "ps_worker_dies.py", str(servers), staleness)
    workers = [r for r in range(np - servers) if r != 1]
    for worker in workers:
        assert f"worker {worker} finished 30 steps: dead workers [1]" in out, out
    for server in range(np - servers, np):
        assert f"parameter server rank {server}: worker rank 1 died after 5 steps" in out, out
        assert f"server {server} done: dead workers ['1']" in out, out


@pytest.mark.mpi
@pytest.mark.parametrize("np", [3])
def test_a_server_that_dies_ends_the_job_with_a_clear_error_on_every_worker(np):
    out = run_surviving(np, "ps_server_dies.py")
    for worker in range(np - 1):
        assert f"worker {worker}: HorovodLiteError: parameter server rank {np - 1}" in out, out
    assert "died while worker rank" in out and "its shard of the parameters is lost" in out, out
