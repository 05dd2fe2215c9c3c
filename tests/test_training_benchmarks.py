"""The training-step benchmarks run end to end on 2 ranks (tiny models, a few steps).

Their timings are not checked (speed is measured, never asserted); what is: every contender
reports a step time at each rank count, and the contenders train the same weights.
"""

import json
import pathlib
import subprocess
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).parent.parent / "benchmarks"
TINY = ["--np", "2", "--models", "mlp", "--mlp-width", "32", "--rounds", "1", "--steps", "2",
        "--warmup", "1"]  # fmt: skip


def run_benchmark(script: str, out: pathlib.Path) -> dict:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *TINY, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert "median step time in ms" in result.stdout
    return json.loads(out.read_text())


def contenders_by_np(report: dict) -> dict:
    found: dict = {}
    for row in report["results"]:
        assert row["median_ms"] > 0 and row["steps"] == 2 and row["model"] == "mlp"
        found.setdefault(row["np"], set()).add(row["contender"])
    return found


@pytest.mark.mpi
def test_torch_ddp_benchmark(tmp_path):
    pytest.importorskip("torch")
    report = run_benchmark("torch_ddp.py", tmp_path / "torch_ddp.json")
    assert contenders_by_np(report) == {
        1: {"local"},
        2: {"local", "hvd", "hvd-nofusion", "hvd-after", "ddp"},
    }
    checks = report["equivalence_checks_max_abs_diff"]
    assert set(checks) == {"np2 mlp:hvd vs ddp", "np2 mlp:hvd-after vs ddp"}
    assert max(checks.values()) < 1e-6, checks


@pytest.mark.mpi
def test_keras_fit_benchmark(tmp_path):
    pytest.importorskip("tensorflow")
    report = run_benchmark("keras_fit.py", tmp_path / "keras_fit.json")
    contenders = {"local", "hvd", "mwms"}
    assert contenders_by_np(report) == {1: contenders, 2: contenders}
    checks = report["equivalence_checks_max_abs_diff"]
    assert checks["np1 mlp:hvd vs mwms"] < 1e-6 and checks["np2 mlp:hvd vs mwms"] < 1e-6, checks
    # The control: at 2 ranks the unaveraged local weights differ, so the check can see a gap.
    assert checks["np1 mlp:hvd vs local"] == 0 and checks["np2 mlp:hvd vs local"] > 1e-6, checks


@pytest.mark.mpi
def test_zero_benchmark(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "zero.json"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "zero.py"), "--np", "2", "--width", "32", "--steps",
         "2", "--warmup", "1", "--repeats", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    rows = {r["contender"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"hvd", "zero1", "zero2", "torch-zero"}
    assert all(r["np"] == 2 and r["steps"] == 2 and r["median_ms"] > 0 for r in rows.values())
    # Counted from the tensors, so exact enough to check: each rank holds half of the state.
    assert rows["zero1"]["state_mb"] < 0.6 * rows["hvd"]["state_mb"]
    assert rows["zero2"]["gradients_mb"] < 0.6 * rows["hvd"]["gradients_mb"]


@pytest.mark.mpi
def test_pipeline_benchmark(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "pipeline.json"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "pipeline.py"), "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    rows = {(r["schedule"], r["chunks"]): r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {("gpipe", 1), ("gpipe", 4), ("1f1b", 1), ("1f1b", 4)}
    assert all(r["np"] == 2 and r["median_ms"] > 0 and len(r["bubble_per_stage"]) == 2
               for r in rows.values())  # fmt: skip
    # Counted from the saved tensors, so exact: with 4 micro-batches on 2 stages, 1F1B holds 2
    # of them on stage 0 and 1 on stage 1; GPipe holds all 4 on both.
    gpipe, one_f_one_b = (rows[s, 4]["saved_mb_per_stage"] for s in ("gpipe", "1f1b"))
    assert one_f_one_b[0] == pytest.approx(gpipe[0] / 2)
    assert one_f_one_b[1] == pytest.approx(gpipe[1] / 4)


@pytest.mark.mpi
def test_synthetic_training_benchmark(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "synthetic.json"
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "synthetic_training.py"), "--settings", "host",
         "--contenders", "hvdlite,hvdlite-gloo", "--model", "tiny", "--image-size", "32",
         "--batch-size", "2", "--warmup", "1", "--steps", "1", "--iters", "1", "--runs", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    (row,) = json.loads(out.read_text())["results"]
    assert row["np"] == 2 and row["parameters"] == 9224 and row["bounds"]["compute_s"] > 0
    assert set(row["median_img_per_s"]) == {"local@1", "local", "hvdlite", "hvdlite-gloo"}
    assert all(value > 0 for value in row["median_img_per_s"].values())


def test_synthetic_training_models_match_torchvision():
    pytest.importorskip("torch")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from synthetic_training import build_model
    finally:
        sys.path.remove(str(BENCHMARKS))
    # torchvision's parameter counts for the same architectures
    counts = {"resnet18": 11_689_512, "resnet50": 25_557_032, "alexnet": 61_100_840}
    for name, count in counts.items():
        assert sum(p.numel() for p in build_model(name).parameters()) == count, name
