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
@pytest.mark.parametrize(
    "module, np",
    [("rank_keras.py", 2), ("rank_equivalence_keras.py", 2), ("rank_equivalence_keras.py", 3)],
)
def test_keras_module_on_the_torch_backend(module, np):
    pytest.importorskip("keras")
    pytest.importorskip("torch")
    result = run_ranks(
        np,
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
         "-o", "python_files=rank_*.py", "--rootdir", str(RANKS_DIR), str(RANKS_DIR / module)],
        timeout=240,
        env={"KERAS_BACKEND": "torch"},
    )  # fmt: skip
    assert result.returncode == 0, f"{module} failed on torch:\n{result.stdout[-20000:]}"
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
