"""The Lightning example runs on 2 ranks: training, rank 0's checkpoints, the test accuracy."""

import pathlib
import re

import pytest
from mpirun import run_ranks

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.mpi
def test_lightning_digits_trains_tests_and_checkpoints(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("pytorch_lightning")
    pytest.importorskip("sklearn")
    # 6 epochs: after 4 the accuracy was 0.8788 with the packages of 2026-11-26 (scikit-learn
    # 1.9.1, numpy 2.4.6), as one process on the whole batch (loss and accuracy to 4 digits)
    # reached too: the target was too close. 0.96 after 6.
    args = ["--epochs", "6", "--target", "0.9", "--checkpoint-dir", str(tmp_path)]
    result = run_ranks(2, [str(EXAMPLES / "lightning_digits.py"), *args], timeout=360)
    assert result.returncode == 0, f"lightning_digits.py failed:\n{result.stdout[-10000:]}"
    found = re.findall(r"^test accuracy (\d\.\d+) on 2 ranks$", result.stdout, re.MULTILINE)
    assert len(found) == 1, f"expected one accuracy line from rank 0:\n{result.stdout[-3000:]}"
    assert float(found[0]) >= 0.9
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["epoch"] == 5 and {"conv1.weight", "fc2.bias"} <= set(saved["state_dict"])
    assert saved["optimizer_states"][0]["state"], "the momentum buffers were not saved"
