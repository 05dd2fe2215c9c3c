"""benchmarks/collective_gradients.py runs end to end on 2 ranks (tiny blocks).

Its timings are not checked (speed is measured, never asserted); what is: every contender of
the frameworks installed here reports a time and the gradient of its formula.
"""

import json
import pathlib

import pytest
from mpirun import run_ranks

BENCHMARK = pathlib.Path(__file__).parent.parent / "benchmarks" / "collective_gradients.py"


@pytest.mark.mpi
def test_collective_gradients_smoke_run(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "gradients.json"
    args = [str(BENCHMARK), "--values", "10", "--repeats", "1", "--block-seconds", "0.01",
            "--out", str(out)]  # fmt: skip
    result = run_ranks(2, args, timeout=240)
    assert result.returncode == 0, result.stdout[-5000:]
    rows = json.loads(out.read_text())["rows"]
    expected = {"hvd allreduce", "gloo all_reduce", "hvd allgather", "gloo all_gather",
                "hvd allreduce Max", "hvd SyncBatchNorm"}  # fmt: skip
    try:
        import jax  # noqa: F401

        expected |= {"jax grad allreduce", "jax grad allgather"}
    except ImportError:
        pass
    assert {r["contender"] for r in rows} == expected
    assert all(r["right"] and r["median_us"] > 0 for r in rows), rows
