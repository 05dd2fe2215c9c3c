"""benchmarks/tf_calls.py runs end to end on 2 ranks (one size, tiny blocks).

Its timings are not checked (speed is measured, never asserted); what is: every contender
reports a time, and every collective's result equals numpy's.
"""

import pytest
from mpirun import benchmark_rows

pytest.importorskip("tensorflow")


@pytest.mark.mpi
def test_tf_calls_smoke_run(tmp_path):
    args = ["--sizes", "1024", "--count", "3", "--repeats", "1", "--block-seconds", "0.01"]
    rows = benchmark_rows("tf_calls.py", args, tmp_path / "tf_calls.json", timeout=300)
    assert len(rows) == 10 and all(r["median_us"] > 0 for r in rows), rows
    checked = [r for r in rows if r["exact"] is not None]
    assert len(checked) == 8 and all(r["exact"] for r in checked), checked
