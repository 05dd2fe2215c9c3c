"""horovodlite.keras on the torch Keras backend: tests/ranks/rank_keras.py again, in its own job.

KERAS_BACKEND is read once, when Keras is first imported, so the torch run needs a job of its
own; tests/test_ranks.py already runs the module on the default (tensorflow) backend.
"""

import os
import pathlib
import subprocess
import sys

import pytest
from mpirun import run_ranks

RANKS_DIR = pathlib.Path(__file__).parent / "ranks"


@pytest.mark.mpi
def test_keras_module_on_the_torch_backend():
    pytest.importorskip("keras")
    pytest.importorskip("torch")
    result = run_ranks(
        2,
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "python_files=rank_*.py",
         "--rootdir", str(RANKS_DIR), str(RANKS_DIR / "rank_keras.py")],
        timeout=240,
        env={"KERAS_BACKEND": "torch"},
    )  # fmt: skip
    assert result.returncode == 0, f"rank_keras.py failed on torch:\n{result.stdout[-20000:]}"
    assert " passed" in result.stdout


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_one_rank_adds_no_communication(backend):
    pytest.importorskip("keras")
    pytest.importorskip(backend)
    script = pathlib.Path(__file__).parent / "jobs" / "size_one_gradients.py"
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "KERAS_BACKEND": backend},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "OK" in result.stdout, output[-5000:]
