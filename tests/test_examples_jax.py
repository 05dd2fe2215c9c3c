"""The JAX example trains on 4 ranks to one process's accuracy and saves a checkpoint; the
mpi4jax benchmark runs horovodlite's side without mpi4jax, and skips with the reason.

A rank that fails during a jitted train step is tested with the other bindings' exits, in
tests/test_exit_jobs.py (tests/jobs/jax_step_fails.py).
"""

import json
import os
import pathlib
import pickle
import re
import subprocess
import sys

import pytest
from mpirun import run_ranks

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"

pytestmark = pytest.mark.mpi


def _run_example(np: int, args: list) -> float:
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    pytest.importorskip("sklearn")
    # A guard against a hang, not a speed limit: 10 s alone at 4 ranks on 2 cores.
    result = run_ranks(np, [str(EXAMPLES / "jax_digits.py"), *args], timeout=300)
    assert result.returncode == 0, f"jax_digits.py failed:\n{result.stdout[-10000:]}"
    found = re.findall(rf"^test accuracy (\d\.\d+) on {np} ranks$", result.stdout, re.MULTILINE)
    assert len(found) == 1, f"expected one accuracy line from rank 0:\n{result.stdout[-3000:]}"
    return float(found[0])


def test_digits_on_4_ranks_reaches_the_accuracy_of_one_process():
    # The docstring states 0.985 at 4 ranks and 0.975 at 1 with the default settings (one
    # process: 0.9748 here); 4 ranks must do at least as well.
    assert _run_example(4, ["--target", "0.97"]) >= 0.9748


def test_digits_few_steps_saves_a_checkpoint_on_rank_0(tmp_path):
    checkpoint = tmp_path / "digits.pkl"
    _run_example(2, ["--epochs", "2", "--max-steps", "3", "--checkpoint", str(checkpoint)])
    saved = pickle.loads(checkpoint.read_bytes())
    assert saved["epoch"] == 2 and len(saved["params"]) == 2
    assert saved["params"][0]["w"].shape == (64, 64)
    assert saved["opt_state"], "the optimizer's momentum was not saved"


# -- benchmarks/jax_vs_mpi4jax.py: horovodlite's side runs without mpi4jax --------------------

BENCHMARK = EXAMPLES.parent / "benchmarks" / "jax_vs_mpi4jax.py"


def test_the_mpi4jax_benchmark_runs_horovodlites_side_without_mpi4jax(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    pytest.importorskip("sklearn")
    out = tmp_path / "bench.json"
    contenders = "hvd-jit,mpi4py,hvd-numpy,hvd-jit-donated,local,hvd"
    tiny = ["--np", "2", "--sizes", "1K", "--contenders", contenders,
            "--models", "digits,cnn", "--repeats", "1", "--block-seconds", "0.01", "--rounds", "1",
            "--steps", "2", "--warmup", "1", "--plot", "", "--out", str(out),
            "--timeout", "240"]  # the benchmark kills its job's ranks before this test's 300 s
    result = subprocess.run([sys.executable, str(BENCHMARK), *tiny], capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    report = json.loads(out.read_text())
    assert {(r["contender"], r["exact"]) for r in report["allreduce"]} == {
        ("hvd-jit", True), ("mpi4py", True), ("hvd-numpy", True), ("hvd-jit-donated", True)}
    assert {(r["model"], r["contender"]) for r in report["training"]} == {
        ("digits", "local"), ("digits", "hvd"), ("cnn", "local"), ("cnn", "hvd")}  # fmt: skip
    assert all(r["steps_per_s"] > 0 for r in report["training"])


def test_the_mpi4jax_benchmark_skips_with_the_reason_where_mpi4jax_is_missing(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "mpi4jax.py").write_text("raise ImportError('No module named mpi4jax')\n")
    path = os.pathsep.join([str(blocked), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    result = subprocess.run([sys.executable, str(BENCHMARK), "--out", str(tmp_path / "b.json")],
                            capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "skipped: mpi4jax is not installed (No module named mpi4jax)" in result.stdout
    assert not (tmp_path / "b.json").exists()
