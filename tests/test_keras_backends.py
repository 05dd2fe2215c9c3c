"""horovodlite.keras on the torch Keras backend: rank_keras.py and rank_equivalence_keras.py again.

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
def test_keras_modules_on_the_torch_backend():
    # Both modules in one job (Keras and torch start once per rank) at 3 ranks: odd, with batch
    # splits that do not divide evenly; test_ranks.py runs them at 2 and 3 on tensorflow.
    # rank_equivalence_keras.py first, as in test_ranks.py.
    pytest.importorskip("keras")
    pytest.importorskip("torch")
    modules = ["rank_equivalence_keras.py", "rank_keras.py"]
    result = run_ranks(
        3,
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
         "-o", "python_files=rank_*.py", "--rootdir", str(RANKS_DIR),
         *(str(RANKS_DIR / module) for module in modules)],
        timeout=360,
        env={"KERAS_BACKEND": "torch"},
    )  # fmt: skip
    assert result.returncode == 0, f"{modules} failed on torch:\n{result.stdout[-20000:]}"
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
