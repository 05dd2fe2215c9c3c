"""Elastic state across restarts: each test runs a job from tests/jobs/elastic_*.py twice under
mpiexec with the same job id and folder, as the elastic launcher would, and checks what the
second run restored."""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from mpirun import mpiexec_argv

from horovodlite.config import Settings
from horovodlite.training.commit_store import CommitStore, commit_folder

pytestmark = pytest.mark.mpi
JOBS = pathlib.Path(__file__).parent / "jobs"
TIMEOUT = 150


def launch(np_: int, script: str, *args, folder, restart: int = 0):
    """Run tests/jobs/`script` as a plain `python` job (its exit status is the job's own)."""
    env = {
        **os.environ,
        "HOROVODLITE_ELASTIC_JOB_ID": "job",
        "HOROVODLITE_ELASTIC_DIR": str(folder),
        "HOROVODLITE_ELASTIC_RESTART": str(restart),
        "HOROVODLITE_ELASTIC_HOSTS_FILE": "",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    argv = mpiexec_argv(np_) + [sys.executable, str(JOBS / script), *map(str, args)]
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script} hung for {TIMEOUT} s:\n{exc.stdout}\n{exc.stderr}")


def output(result) -> str:
    return result.stdout + result.stderr


def store(folder, rank) -> CommitStore:
    return CommitStore(commit_folder(str(folder), "job", rank))


def test_the_default_folder_is_under_the_temp_dir():
    assert Settings().elastic_dir.endswith("horovodlite-elastic")


def test_the_newest_commit_any_rank_holds_is_restored(tmp_path):
    first = launch(3, "elastic_objects.py", "write", folder=tmp_path)
    assert first.returncode == 0, output(first)
    assert [store(tmp_path, r).numbers() for r in range(3)] == [[3, 2]] * 3
    # Rank 0 loses every copy, rank 2 its newest: only rank 1 still holds commit 3.
    for number in (2, 3):
        os.remove(store(tmp_path, 0).path(number))
    os.remove(store(tmp_path, 2).path(3))
    second = launch(3, "elastic_objects.py", "read", folder=tmp_path, restart=1)
    assert second.returncode == 0, output(second)
    for rank in range(3):
        assert f"rank {rank} value 30 commit 3" in second.stdout, output(second)
        assert f"rank {rank} reset" in second.stdout
        assert store(tmp_path, rank).numbers()[0] == 3  # stored again where it was missing


def test_a_commit_interrupted_half_written_is_never_restored(tmp_path):
    first = launch(2, "elastic_objects.py", "crash", folder=tmp_path)
    assert first.returncode != 0, output(first)
    assert "done" not in first.stdout
    for rank in range(2):
        left = os.listdir(os.path.dirname(store(tmp_path, rank).path(0)))
        assert any(".tmp-" in name for name in left), left  # the half-written commit 3
    second = launch(2, "elastic_objects.py", "read", folder=tmp_path, restart=1)
    assert second.returncode == 0, output(second)
    for rank in range(2):
        assert f"rank {rank} value 20 commit 2" in second.stdout, output(second)


def test_a_resize_from_3_to_2_ranks_trains_on_every_sample_once_per_epoch(tmp_path):
    epochs = 3
    first = launch(3, "elastic_train.py", epochs, 7, folder=tmp_path)
    assert first.returncode != 0 and "seen" not in first.stdout, output(first)
    second = launch(2, "elastic_train.py", epochs, -1, folder=tmp_path, restart=1)
    assert second.returncode == 0, output(second)
    assert "rank 1 reset at size 2 epoch 1" in second.stdout, output(second)
    seen = re.search(r"seen \[([\d, ]+)\] commit (\d+)", second.stdout)
    assert seen, output(second)
    assert [int(c) for c in seen.group(1).split(",")] == [epochs] * 30
    # 5 commits per epoch at 3 ranks (2 of epoch 1 kept), 5 + 8 at 2 ranks.
    assert int(seen.group(2)) == 7 + 5 + 8


def _keras_weights(result) -> np.ndarray:
    found = re.search(r"weights ([-\d.e, ]+)", result.stdout)
    assert found, output(result)
    return np.array([float(w) for w in found.group(1).split(",")])


def test_keras_fit_resumes_at_the_committed_epoch(tmp_path):
    whole = launch(2, "elastic_keras.py", 4, -1, folder=tmp_path / "whole")
    assert whole.returncode == 0, output(whole)
    killed = launch(2, "elastic_keras.py", 4, 2, folder=tmp_path / "killed")
    assert killed.returncode != 0 and "weights" not in killed.stdout, output(killed)
    resumed = launch(2, "elastic_keras.py", 4, -1, folder=tmp_path / "killed", restart=1)
    assert resumed.returncode == 0, output(resumed)
    assert "rank 0 starts at epoch 2" in resumed.stdout, output(resumed)
    np.testing.assert_allclose(_keras_weights(resumed), _keras_weights(whole), rtol=1e-6)
