"""benchmarks/collective_gradients.py runs end to end on 2 ranks (tiny blocks).

Its timings are not checked (speed is measured, never asserted); what is: every contender of
the frameworks installed here reports a time and the gradient of its formula.
"""

import pytest
from mpirun import benchmark_rows


@pytest.mark.mpi
def test_collective_gradients_smoke_run(tmp_path):
    pytest.importorskip("torch")
    args = ["--values", "10", "--repeats", "1", "--block-seconds", "0.01"]
    rows = benchmark_rows("collective_gradients.py", args, tmp_path / "gradients.json")
    expected = {"hvd allreduce", "gloo all_reduce", "hvd allgather", "gloo all_gather",
                "hvd allreduce Max", "hvd SyncBatchNorm"}  # fmt: skip
    try:
        import jax  # noqa: F401

        expected |= {"jax grad allreduce", "jax grad allgather"}
    except ImportError:
        pass
    assert {r["contender"] for r in rows} == expected
    assert all(r["right"] and r["median_us"] > 0 for r in rows), rows
