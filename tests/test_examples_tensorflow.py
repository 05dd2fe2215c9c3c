"""The TensorFlow and Keras examples train on 2 ranks and reach the accuracy they state.

Each example exits non-zero below its target accuracy (0.90 on scikit-learn's digits).
keras_digits.py runs on the tensorflow backend here; tests/test_keras_backends.py covers torch.
"""

import pathlib
import re

import pytest
from mpirun import run_ranks

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"

CASES = [
    ("keras_digits.py", [], "tensorflow"),
    ("tensorflow2_digits.py", [], "tensorflow"),
    ("tensorflow1_template.py", [], "tensorflow"),
]


@pytest.mark.mpi
@pytest.mark.parametrize("script, args, backend", CASES)
def test_example_reaches_its_accuracy(script, args, backend):
    pytest.importorskip("tensorflow")
    pytest.importorskip("sklearn")
    if backend == "torch":
        pytest.importorskip("torch")
    result = run_ranks(
        2, [str(EXAMPLES / script), *args], timeout=180, env={"KERAS_BACKEND": backend}
    )
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-10000:]}"
    found = re.search(r"test accuracy (\d\.\d+) on 2 ranks", result.stdout)
    assert found and float(found.group(1)) >= 0.90, result.stdout[-3000:]
