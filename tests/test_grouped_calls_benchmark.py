"""benchmarks/grouped_calls.py runs end to end on 2 ranks (one size, tiny blocks).

Its timings are not checked (speed is measured, never asserted); what is: every contender that
can run here reports a time and a result equal to MPI's own.
"""

import pytest
from mpirun import benchmark_rows


@pytest.mark.mpi
def test_grouped_calls_smoke_run(tmp_path):
    args = ["--sizes", "1024", "--count", "3", "--repeats", "1", "--block-seconds", "0.01"]
    rows = benchmark_rows("grouped_calls.py", args, tmp_path / "grouped.json")
    expected = {"core grouped", "core via engine", "core one by one", "mpi4py"}
    for module, contender in (("torch", "torch grouped"), ("jax", "jax jit grouped")):
        try:
            __import__(module)
            expected.add(contender)
        except ImportError:
            pass
    for kind in ("allgather", "reducescatter", "allreduce"):
        mine = [r for r in rows if r["collective"] == kind]
        assert {r["contender"] for r in mine} == expected, kind
        assert all(r["exact"] and r["median_us"] > 0 for r in mine), mine
