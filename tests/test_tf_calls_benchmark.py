"""benchmarks/tf_calls.py runs end to end on 2 ranks (one size, tiny blocks).

Its timings are not checked (speed is measured, never asserted); what is: every contender
reports a time, and every collective's result equals numpy's.
"""

import json
import pathlib

import pytest
from mpirun import run_ranks

pytest.importorskip("tensorflow")

BENCHMARK = pathlib.Path(__file__).parent.parent / "benchmarks" / "tf_calls.py"


@pytest.mark.mpi
def test_tf_calls_smoke_run(tmp_path):
    out = tmp_path / "tf_calls.json"
    args = [str(BENCHMARK), "--sizes", "1024", "--count", "3", "--repeats", "1",
            "--block-seconds", "0.01", "--out", str(out)]  # fmt: skip
    result = run_ranks(2, args, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 10 and all(r["median_us"] > 0 for r in rows), rows
    checked = [r for r in rows if r["exact"] is not None]
    assert len(checked) == 8 and all(r["exact"] for r in checked), checked
