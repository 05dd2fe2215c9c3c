"""Parameter-server jobs where a rank dies (hvd.ps): run under `mpiexec -disable-auto-cleanup`,
or `horovodlite-run --parameter-servers`, which passes it.

MPICH's launcher ends the whole job when one rank exits without MPI_Finalize unless told not
to; with that flag the surviving ranks go on, which is what a dying worker needs. Open MPI has
no such switch here: these tests run with MPICH's Hydra only.
"""

import os
import pathlib
import re
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
    return run(argv, timeout)[1]


def run(argv: list, timeout: float, env=None) -> tuple:
    """Run `argv` in its own session; return (status, output), killing it all past `timeout`."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0] + f"\n*** killed after {timeout} s: the job hung ***"
    return proc.returncode, out


def horovodlite_run(flags: list, script: str, *args, env=None, timeout: float = 240) -> tuple:
    """Run `horovodlite-run FLAGS python tests/jobs/SCRIPT ARGS`; return (status, output)."""
    if "-n" != mpiexec_argv(2)[1]:
        pytest.skip("needs MPICH's Hydra launcher (-disable-auto-cleanup)")
    argv = [sys.executable, "-m", "horovodlite.run", *flags, sys.executable, str(JOBS / script),
            *map(str, args)]  # fmt: skip
    return run(argv, timeout, env)


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


@pytest.mark.mpi
@pytest.mark.parametrize("np, how", [(2, "between-parts"), (3, "mid-array"), (4, "between-parts")])
def test_a_server_that_dies_mid_message_gives_every_worker_the_clear_error(np, how):
    # Before messages.py, worker 0 waited forever for the parts after the first (pkl5's
    # blocking probe), or got a bare MPI error where MPICH copied the array from the dead rank.
    out = run_surviving(np, "ps_sender_dies.py", "server", how, timeout=60)
    for worker in range(np - 1):
        assert f"worker {worker}: HorovodLiteError: parameter server rank {np - 1}" in out, out
    assert "MPI error" not in out and "Traceback" not in out, out


@pytest.mark.mpi
@pytest.mark.parametrize("np, how", [(2, "between-parts"), (3, "mid-array"), (4, "between-parts")])
def test_a_worker_that_dies_mid_message_leaves_the_server_running(np, how):
    out = run_surviving(np, "ps_sender_dies.py", "worker", how, timeout=60)
    dying = np - 2
    for worker in range(dying):
        assert f"worker {worker} finished 5 steps: dead workers [{dying}]" in out, out
    # A whole push read before its sender was gone counts (a race the job cannot rule out).
    counted = 1 if how == "mid-array" and f"{{'{dying}': 1}}" in out else 0
    assert (
        f"server done: {5 * dying + counted} updates, dead workers {{'{dying}': {counted}}}" in out
    ), out
    assert "Traceback" not in out, out


@pytest.mark.mpi
def test_horovodlite_run_parameter_servers_lets_a_job_outlive_a_dying_worker():
    status, out = horovodlite_run(["--parameter-servers", "-np", "3"], "ps_worker_dies.py",
                                  1, "none")  # fmt: skip
    assert "worker 0 finished 30 steps: dead workers [1]" in out, out
    assert "parameter server rank 2: worker rank 1 died after 5 steps" in out, out
    assert "server 2 done: dead workers ['1']" in out, out
    assert status != 0, out  # the job did lose a rank; horovodlite-run says so


@pytest.mark.mpi
@pytest.mark.parametrize("np, servers, how", [(3, 1, "kill"), (4, 2, "exit")])
def test_a_dead_server_resumes_from_the_last_checkpoint_under_the_elastic_launcher(
    np, servers, how, tmp_path
):
    steps, every, kill_at = 12, 4, 10  # checkpoints at updates 4 and 8; killed at update 10
    env = {**os.environ, "HOROVODLITE_ELASTIC_DIR": str(tmp_path)}
    env.pop("HOROVODLITE_ELASTIC_JOB_ID", None)
    flags = ["--parameter-servers", "--min-np", str(np), "--max-np", str(np),
             "--restart-delay", "0"]  # fmt: skip
    status, out = horovodlite_run(flags, "ps_resume.py", servers, steps, every, kill_at, how,
                                  env=env)  # fmt: skip
    assert status == 0, out
    if how == "exit":  # SIGKILL: MPICH's launcher ends the job at once, before any message
        assert "its shard of the parameters is lost" in out, out
        assert "the job resumes from their last common checkpoint" in out, out
    for worker in range(np - servers):  # (ranks' lines may run together: numbers end them)
        resumed = re.search(rf"run 1 worker {worker}: starts at step (\d+) \(checkpoint (\w+)\), "
                            r"parameters off one process's by ([0-9.e+-]+)", out)  # fmt: skip
        assert resumed and resumed.groups()[:2] == ("8", "8"), out
        assert float(resumed.group(3)) < 1e-9, out  # the checkpoint's parameters, exactly
        finished = re.search(rf"run 1 worker {worker}: finished {steps} steps, parameters off "
                             r"one process's by ([0-9.e+-]+)", out)  # fmt: skip
        assert finished and float(finished.group(1)) < 1e-9, out
    assert len(list(tmp_path.glob(f"*/ps-server-{servers - 1}/commit-*.bin"))) >= 1
