"""Nothing hangs: a rank that leaves early, or never arrives, ends the job with an error that
names it, on every rank that can still act.

Each case is its own MPI job (tests/jobs/) under a timeout; the bound it must meet is checked
from the time the surviving ranks report.
"""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import pytest
from mpi4py import MPI
from mpirun import run_ranks
from test_engine_jobs import ENGINE_VARIABLES, JOBS, job

pytestmark = pytest.mark.mpi

LEAVE = ["exit0", "exit1", "return", "finally", "shutdown"]
WAIT = ["sync", "async", "barrier"]
BOUND = 30  # seconds from a rank leaving to the error on the others


def _check_survivors(out: str, survivors: list, pattern: str) -> None:
    for rank in survivors:
        found = re.search(rf"rank {rank} raised after ([0-9.]+) s: (.*)", out)
        assert found, out
        assert float(found.group(1)) < BOUND, out
        assert re.search(pattern, found.group(2)), out
    assert "was not stopped" not in out and "was not torn down" not in out, out


@pytest.mark.parametrize("where", WAIT)
@pytest.mark.parametrize("how", LEAVE)
def test_a_rank_that_leaves_early_ends_the_job(how, where):
    result = job(3, "early_exit.py", how, where, module_runner=False)
    assert result.returncode != 0, result.stdout
    left = "called hvd.shutdown()" if how in ("finally", "shutdown") else "exited"
    named = f"rank 1 {left}" if where != "async" else "shut down on rank 1"
    _check_survivors(result.stdout, [0, 2], re.escape(named))


@pytest.mark.parametrize("how", ["exit0", "shutdown"])
def test_a_rank_that_leaves_early_ends_a_two_rank_job(how):
    result = job(2, "early_exit.py", how, "sync", module_runner=False)
    assert result.returncode != 0, result.stdout
    _check_survivors(result.stdout, [0], "rank 1 (exited|called hvd.shutdown)")


@pytest.mark.parametrize("where", ["sync", "async"])
def test_the_collective_timeout_names_the_missing_rank_and_tears_down(where):
    result = job(3, "timeout.py", where, env={"HOROVODLITE_COLLECTIVE_TIMEOUT": "2"})
    assert result.returncode != 0, result.stdout
    missing = "rank 2 did not arrive" if where == "sync" else "is missing ranks \\[2\\]"
    for rank in (0, 1):
        found = re.search(rf"rank {rank} raised after ([0-9.]+) s: (.*)", result.stdout)
        assert found and re.search(missing, found.group(2)), result.stdout
        assert "HOROVODLITE_COLLECTIVE_TIMEOUT" in found.group(2)
    # Torn down: the ranks caught the error and slept 30 s; the job did not wait for them. (No
    # bound on the job's wall time: start-up alone takes tens of seconds on a loaded machine.)
    assert "was not torn down" not in result.stdout


@pytest.mark.parametrize("np", [2, 3])
def test_a_sync_and_an_async_call_under_one_name_raise_everywhere(np):
    result = job(np, "sync_meets_async.py", "same")
    out = result.stdout
    assert result.returncode != 0, out
    _check_survivors(out, [0], "submitted it asynchronously .* called it synchronously")
    _check_survivors(out, range(1, np), "asynchronously while rank 0 called it synchronously")


@pytest.mark.parametrize("np", [3, 4])
def test_one_async_call_against_synchronous_ones_raises_everywhere(np):
    # Fault campaign seed 36: only the waiting ranks whose notice had come were told, and the
    # others were torn down without an error of their own.
    out = job(np, "sync_meets_async.py", "reverse").stdout
    _check_survivors(out, [0], "rank 0 submitted it asynchronously while ranks? [0-9, ]+ called it")
    _check_survivors(out, range(1, np), "submitted it asynchronously .* called it synchronously")


@pytest.mark.parametrize("np", [2, 3, 4])
@pytest.mark.parametrize("call", ["allreduce", "barrier", "remove_process_set"])
def test_a_sync_call_against_an_async_wait_under_another_name_raises_everywhere(call, np):
    # Rank 0 waits in a synchronous collective, the others in hvd.synchronize() on an async
    # all-reduce rank 0 never submits: found from where the ranks wait, not from the timeout.
    result = job(np, "sync_meets_async.py", call, env={"HOROVODLITE_COLLECTIVE_TIMEOUT": "600"})
    out = result.stdout
    assert result.returncode != 0, out
    sync = {"allreduce": "allreduce 'sync.x'", "barrier": "barrier", "remove_process_set":
            "remove_process_set 1"}[call]  # fmt: skip
    both = (
        rf"rank \d waits in hvd.synchronize\(\) for the asynchronous allreduce 'g', which rank 0 "
        rf"did not submit, while rank 0 waits in the synchronous {sync}.*neither side can go on"
    )
    _check_survivors(out, range(np), both)
    for rank in range(1, np):
        assert re.search(rf"rank {rank} raised after [0-9.]+ s: rank {rank} waits", out), out


def _horovodlite_run(np: int, script: str, *args) -> tuple:
    """Run `horovodlite-run -np NP python tests/jobs/SCRIPT ARGS`; return (status, output)."""
    argv = [sys.executable, "-m", "horovodlite.run", "-np", str(np), sys.executable,
            str(JOBS / script), *args]  # fmt: skip
    env = {**os.environ, **dict.fromkeys(ENGINE_VARIABLES, "")}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the job hung:\n{proc.communicate()[0]}")
    return proc.returncode, out


def _assert_named_from_outside(status: int, out: str) -> None:
    assert status != 0, out
    pid = re.search(r"rank 1 ready, pid (\d+)", out).group(1)
    assert f"horovodlite-run: rank 1 (pid {pid}) ended without leaving horovodlite" in out, out


@pytest.mark.parametrize("how", ["os_exit", "sigkill"])
def test_horovodlite_run_names_a_rank_that_ends_without_python(how):
    # No Python runs in that rank and MPI's launcher kills the others at once: horovodlite-run
    # names it from outside (run/exit_watch.py).
    _assert_named_from_outside(*_horovodlite_run(3, "early_exit.py", how, "sync"))


# -- JAX: rank 1 fails during jitted training (tests/jobs/jax_step_fails.py) while the others wait
# in the step's all-reduce, inside XLA, in an ordered io_callback.


@pytest.mark.parametrize("module_runner", [True, False], ids=["python-m-mpi4py", "python"])
@pytest.mark.parametrize("how", ["raise", "raise-between"], ids=["in-the-step", "between-steps"])
def test_an_error_on_one_rank_in_jitted_training_ends_the_job(how, module_runner):
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    result = job(3, "jax_step_fails.py", how, module_runner=module_runner)
    out = result.stdout
    assert result.returncode not in (0, -9) and "killed after" not in out, out
    assert "RuntimeError: rank 1 fails on purpose" in out, out
    kind = "JaxRuntimeError" if how == "raise" else "RuntimeError"  # JAX's, from inside a step
    assert f"horovodlite: rank 1 exits on an uncaught {kind}: aborting the job" in out, out
    assert "was not stopped" not in out, out


def test_a_rank_that_exits_during_jitted_training_is_named_by_the_others():
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    result = job(3, "jax_step_fails.py", "exit", module_runner=False)
    assert result.returncode != 0, result.stdout
    _check_survivors(result.stdout, [0, 2], r"rank 1 exited while rank [02] waited for it")


def test_a_rank_killed_in_a_jitted_step_is_named_by_horovodlite_run():
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    _assert_named_from_outside(*_horovodlite_run(3, "jax_step_fails.py", "kill"))


def test_horovodlite_run_says_nothing_when_every_rank_leaves():
    result = subprocess.run(
        [sys.executable, "-m", "horovodlite.run", "-np", "2", sys.executable, "-c",
         "import os, horovodlite as hvd; hvd.init(); hvd.shutdown(); os._exit(0)"],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert result.returncode == 0 and "ended without" not in result.stderr, result.stderr


def test_a_test_that_fails_on_one_rank_ends_its_module_at_once(tmp_path):
    # tests/ranks/conftest.py prints the failure and aborts the job: the other ranks, waiting
    # in a collective the failed rank left, do not sit there until the launcher's timeout.
    shutil.copy(pathlib.Path(__file__).parent / "ranks" / "conftest.py", tmp_path)
    (tmp_path / "rank_fails.py").write_text(
        "import numpy as np\nimport horovodlite as hvd\n\n"
        "def test_fails_on_the_last_rank():\n"
        "    assert hvd.rank() != hvd.size() - 1, 'deliberate'\n"
        "    hvd.allreduce(np.ones(2), name='never')\n"
    )
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
            "--rootdir", str(tmp_path), str(tmp_path / "rank_fails.py")]  # fmt: skip
    result = run_ranks(3, args, timeout=120)
    assert "killed after" not in result.stdout and result.returncode != 0, result.stdout
    assert "[rank 2 of 3] FAILED rank_fails.py::test_fails_on_the_last_rank" in result.stdout
    assert "AssertionError: deliberate" in result.stdout, result.stdout


# MPICH over UCX names every message left unreceived at MPI_Finalize ("unexpected tag-receive
# descriptor ... was not matched"); over shared memory nothing would tell. MPIR_CVAR_NOLOCAL=1
# sends the ranks of one host through UCX too.
UCX = "MPICH" in MPI.Get_library_version() and "ucx" in MPI.Get_library_version()


FINALIZE_CASES = [
    (how, np) for how in ("normal", "restart", "mismatch", "early") for np in (2, 3, 4)
]
FINALIZE_CASES += [("early_exit", 3), ("early_async", 3)]


@pytest.mark.skipif(not UCX, reason="needs MPICH built with UCX, whose warnings tell")
@pytest.mark.parametrize("how, np", FINALIZE_CASES)
def test_no_message_is_left_unreceived_at_finalize(how, np):
    # early, early_exit: rank 1 leaves while the others wait in a synchronous collective. Their
    # half of it stays posted (MPI cannot cancel a collective): before, they caught the error,
    # finalized, and UCX found 3 messages unreceived at 3 ranks; now they abort at exit.
    result = job(np, "clean_finalize.py", how, env={"MPIR_CVAR_NOLOCAL": "1"}, module_runner=False)
    out = result.stdout
    assert all(f"rank {rank} done" in out for rank in range(np)), out
    assert "UCX" not in out and "not matched" not in out, out
    if how in ("early", "early_exit"):
        assert result.returncode != 0, out
        assert "a failed collective that is still posted: aborting the job" in out, out
    else:
        assert result.returncode == 0, out
