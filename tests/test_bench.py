"""The benchmark: its method's arithmetic, its correctness check, and the CLI end to end."""

import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import pytest

from horovodlite.bench import cli, gpu
from horovodlite.bench.method import Timing, bus_factor, format_size, message_sizes, parse_size
from horovodlite.bench.peers import _Buffers, _checker
from horovodlite.bench.report import CSV_COLUMNS, format_tables
from horovodlite.bench.sweep import element_count, result_row


def test_sizes_and_units():
    assert message_sizes(8, 64) == [8, 16, 32, 64]
    assert message_sizes(8, 100, factor=4) == [8, 32, 100]
    assert parse_size("64M") == 64 << 20 and parse_size("1KiB") == 1024 and parse_size("8") == 8
    assert format_size(64 << 20) == "64 MiB" and format_size(12) == "12 B"
    with pytest.raises(ValueError):
        parse_size("12 parsecs")
    with pytest.raises(ValueError):
        message_sizes(64, 8)


def test_nccl_tests_bus_factors():
    assert bus_factor("allreduce", 4) == 1.5
    assert bus_factor("allgather", 4) == 0.75
    assert bus_factor("reducescatter", 8) == 0.875
    assert bus_factor("broadcast", 8) == 1.0


def test_element_count_divides_for_allgather_and_reducescatter():
    assert element_count("allreduce", 8, 3) == 2
    assert element_count("allgather", 8, 3) == 3  # at least one element per rank
    assert element_count("reducescatter", 1024, 3) == 255
    assert element_count("reducescatter", 1024, 3) % 3 == 0


@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "allgather", "reducescatter"])
def test_correctness_check_catches_a_wrong_result(collective):
    comm = SimpleNamespace(size=3, rank=1)  # as seen from rank 1 of 3
    buffers = _Buffers(collective, 30, comm)
    right = buffers.expected()
    assert _checker(buffers, lambda: right.copy())()
    wrong = right.copy()
    wrong[-1] += 1
    assert not _checker(buffers, lambda: wrong)()
    assert not _checker(buffers, lambda: right[:-1])()


def test_table_marks_failed_checks():
    row = {
        "collective": "allreduce",
        "bytes": 8,
        "count": 2,
        "repeats": 3,
        "time_us": 5.5,
        "busbw_GBps": 0.001,
    }
    run = {
        "setting": "2 ranks",
        "rows": [
            {**row, "contender": "ring", "correct": True},
            {**row, "contender": "naive", "correct": False, "time_us": 11.0},
        ],
    }
    text = format_tables(run)
    assert "11.0!" in text and "5.5 " in text and "naive/ring" in text and "2.00" in text


def test_cli_rejects_bad_sizes():
    result = subprocess.run(
        [sys.executable, "-m", "horovodlite.bench", "--min-size", "1K", "--max-size", "8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "smallest <= largest" in result.stderr


def test_cli_two_ranks_writes_checked_results(tmp_path):
    contenders = ["ring", "naive", "mpi", "auto", "auto-nocheck", "mpi-native"]
    gloo = importlib.util.find_spec("torch") is not None
    if gloo:
        contenders.append("gloo")
    argv = [
        sys.executable,
        "-m",
        "horovodlite.bench",
        "--np",
        "2",
        "--min-size",
        "8",
        "--max-size",
        "4K",
        "--size-factor",
        "64",
        "--time-per-size",
        "0.002",
        "--repeats",
        "2",
        "--min-iterations",
        "2",
        "--max-iterations",
        "20",
        "--contenders",
        ",".join(contenders),
        "--out",
        str(tmp_path),
        "--name",
        "t",
        "--no-progress",
        "--timeout",
        "90",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "time per call (µs)" in result.stdout and "bus bandwidth (GB/s)" in result.stdout

    with open(tmp_path / "t.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == CSV_COLUMNS
    sizes = {8, 512, 4096}
    expected = {
        "allreduce": set(contenders),
        "reducescatter": {c for c in contenders if c != "naive"},
        "broadcast": {"auto", "auto-nocheck", "mpi-native"} | ({"gloo"} if gloo else set()),
        "allgather": {"auto", "auto-nocheck", "mpi-native"} | ({"gloo"} if gloo else set()),
    }
    seen = {(r["collective"], r["contender"], int(r["bytes"])) for r in rows}
    assert seen == {(c, name, s) for c, names in expected.items() for name in names for s in sizes}
    for row in rows:
        assert row["correct"] == "True", row
        assert row["ranks"] == "2" and row["hosts"] == "1"
        assert float(row["time_us"]) > 0 and int(row["iterations"]) >= 2
        assert float(row["time_us_min"]) <= float(row["time_us"]) <= float(row["time_us_max"])
        factor = bus_factor(row["collective"], 2)
        assert float(row["busbw_GBps"]) == pytest.approx(float(row["algbw_GBps"]) * factor, 1e-4)
        assert row["metadata_check"] == ("off" if row["contender"] == "auto-nocheck" else "on")

    with open(tmp_path / "t.json") as f:
        runs = json.load(f)["runs"]
    assert len(runs) == 1 and runs[0]["facts"]["ranks"] == 2
    assert len(runs[0]["rows"]) == len(rows)
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed: no plots to check")
    for collective in expected:
        png = tmp_path / f"t_{collective}.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(tmp_path / "t_allreduce.png") > 10000


def _fake_gpu_measure(comm, args, schedule):
    """Stand in for gpu.measure(): the rows a one-rank GPU run returns, with no GPU."""
    assert args.collectives == list(gpu.COLLECTIVES)  # the launcher passed the GPU's defaults
    timing = Timing(schedule.min_iterations, 5, (2e-5,) * schedule.repeats)
    rows = [
        {**result_row(collective, name, 1024, comm.size, timing, True), "transport": moved}
        for collective in args.collectives
        for name, moved in (("horovodlite", "nccl"), ("torch-nccl", "nccl"))
    ]
    return rows, {"gpu": "Fake GPU 80GB", "gpus_per_host": 1}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_launcher_collects_the_jobs_run_wherever_the_job_starts(device, tmp_path, monkeypatch):
    """`--np 1 --out DIR`: the job writes its run where the launcher reads it (issue #38).

    The launcher and its job run in this process, the job in another working folder; every step
    is the command line's own (the job's arguments, its measurement, tables and result file, the
    launcher's outputs) except that with --device cuda the GPU measurement is replaced.
    """
    if device == "cuda":
        monkeypatch.setattr(gpu, "cuda_missing", lambda: "")
        monkeypatch.setattr(gpu, "measure", _fake_gpu_measure)
    elsewhere = tmp_path / "job"
    elsewhere.mkdir()
    jobs = []

    def execute(argv, env, timeout):
        jobs.append(argv)
        monkeypatch.chdir(elsewhere)
        return cli.main(argv[argv.index("horovodlite.bench") + 1 :])

    monkeypatch.setattr(cli, "_execute", execute)
    out = tmp_path / "results"
    argv = ["--device", device, "--np", "1", "--out", str(out), "--no-plot", "--no-progress"]
    if device == "cpu":
        argv += ["--collectives", "allreduce", "--contenders", "mpi,mpi-native", "--max-size",
                 "64", "--size-factor", "8", "--time-per-size", "0.001", "--repeats", "1",
                 "--min-iterations", "1", "--max-iterations", "2"]  # fmt: skip
    sigterm = signal.getsignal(signal.SIGTERM)  # launch() unwinds on SIGTERM
    try:
        assert cli.main(argv) == 0
    finally:
        signal.signal(signal.SIGTERM, sigterm)

    [job] = jobs
    assert job[job.index("--worker-output") + 1].startswith(tempfile.gettempdir())
    assert list(elsewhere.iterdir()) == []  # nothing written in the job's working folder
    name = "collectives" if device == "cpu" else "collectives_cuda"
    assert sorted(os.listdir(out)) == [name + ".csv", name + ".json"]
    with open(out / f"{name}.json") as f:
        [run] = json.load(f)["runs"]
    assert run["facts"]["ranks"] == 1 and run["rows"]
    assert all(row["correct"] for row in run["rows"])
    with open(out / f"{name}.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(run["rows"]) and list(rows[0]) == CSV_COLUMNS
    if device == "cuda":
        assert "Fake GPU 80GB" in run["setting"]
        assert {r["collective"] for r in rows} == set(gpu.COLLECTIVES)
        assert {r["transport"] for r in rows} == {"nccl"}
        assert float(rows[0]["time_us"]) == pytest.approx(20.0)
    else:
        assert {(r["contender"], int(r["bytes"])) for r in rows} == {
            (c, s) for c in ("mpi", "mpi-native") for s in (8, 64)
        }
