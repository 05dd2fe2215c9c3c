"""benchmarks/cpu_twin.py runs end to end on 2 ranks (one size, tiny blocks, a few pairs).

Its timings are not checked (speed is measured, never asserted); what is: every contender
reports a time, the paired differences (against Gloo on torch's group and on horovodlite's) are
there, one per round, and the table reports them.
"""

import json
import pathlib
import subprocess
import sys

import pytest

BENCHMARK = pathlib.Path(__file__).parent.parent / "benchmarks" / "cpu_twin.py"


@pytest.mark.mpi
def test_cpu_twin_smoke_run_with_pairs(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "cpu_twin.json"
    argv = [sys.executable, str(BENCHMARK), "--np", "2", "--sizes", "1024", "--repeats", "1",
            "--time-per-block", "0.01", "--pairs", "12", "--output", str(out)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    (row,) = json.loads(out.read_text())["results"]
    assert row["bytes"] == 1024
    assert all(row[name] > 0 for name in ("hvd", "gloo", "gloo-after-sync", "floor")), row
    assert len(row["differences"]) == len(row["differences_same_group"]) == 12
    assert "1024 bytes: hvd - gloo-after-sync, 12 rounds: median" in result.stdout
    assert "1024 bytes: hvd - gloo on hvd's group, 12 rounds: median" in result.stdout
