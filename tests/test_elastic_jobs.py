"""Elastic jobs end to end: horovodlite-run restarts, shrinks and grows real training jobs.

Each job runs `horovodlite-run` under a hard timeout (its whole process group and, on simulated
hosts, its namespaces are killed past it). The torch job (tests/jobs/elastic_launch_train.py) is
deterministic: a run whose rank 1 is SIGKILLed restarts from the last commit and ends with the
parameters of an uninterrupted run, bit for bit. The JAX job (tests/jobs/elastic_launch_jax.py)
resumes at fewer ranks and ends with the parameters of one process, up to rounding.
"""

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter

import pytest
from test_engine_jobs import ENGINE_VARIABLES, JOBS

from horovodlite.run.simcluster import unavailable_reason

pytestmark = pytest.mark.mpi

SAMPLES = 24  # elastic_launch_train.py's dataset


def launch(tmp_path, flags: list, script: str, *args, timeout: float = 150) -> tuple:
    """Run `horovodlite-run FLAGS python tests/jobs/SCRIPT ARGS`; return (status, output)."""
    argv = [sys.executable, "-m", "horovodlite.run", "--restart-delay", "0", *flags,
            sys.executable, str(JOBS / script), *map(str, args)]  # fmt: skip
    env = {**os.environ, **dict.fromkeys(ENGINE_VARIABLES, ""),
           "HOROVODLITE_ELASTIC_DIR": str(tmp_path / "commits")}  # fmt: skip
    env.pop("HOROVODLITE_ELASTIC_JOB_ID", None)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the launcher passes it to mpiexec (in its own session), which ends
        # the ranks and, on simulated hosts, the launcher removes the cluster.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the elastic job hung past {timeout} s:\n{proc.communicate()[0][-5000:]}")
    return proc.returncode, out


def assert_restarted_for_rank_1(out: str, host: str) -> None:
    """Check that the first restart names rank 1 on `host` (maybe beside ranks mpiexec killed)."""
    named = re.search(r"elastic: restart 1 \(([^)]*) ended without leaving horovodlite", out)
    assert named and f"rank 1 on {host}" in named.group(1).split(", "), out


def discovery(tmp_path, *outputs: str) -> str:
    """Return a discovery script that prints outputs[k] on its k-th call (the last from then on)."""
    calls = tmp_path / "discovery-calls"
    cases = "\n".join(f"  {k}) echo '{text}' ;;" for k, text in enumerate(outputs[:-1]))
    path = tmp_path / "discover.sh"
    path.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {calls} 2>/dev/null || echo 0); echo $((n + 1)) > {calls}\n"
        f"case \"$n\" in\n{cases}\n  *) echo '{outputs[-1]}' ;;\nesac\n"
    )
    path.chmod(0o755)
    return str(path)


def steps(out_dir) -> list:
    with open(out_dir / "steps.jsonl") as f:
        return [json.loads(line) for line in f]


def effective_steps(records: list) -> dict:
    """Return {step: [records]} of the steps that count: each from the last run that made it.

    A run that failed after its last commit made steps that the next run redid.
    """
    last = {}
    for r in records:
        last[r["step"]] = max(last.get(r["step"], -1), r["restart"])
    kept = {}
    for r in records:
        if r["restart"] == last[r["step"]]:
            kept.setdefault(r["step"], []).append(r)
    return kept


def assert_each_sample_once_per_epoch(records: list, epochs: int = 2) -> None:
    seen = {epoch: Counter() for epoch in range(epochs)}
    for step_records in effective_steps(records).values():
        for r in step_records:
            seen[r["epoch"]].update(r["indices"])
    for epoch, counts in seen.items():
        assert sorted(counts) == list(range(SAMPLES)), (epoch, counts)
        assert set(counts.values()) == {1}, f"epoch {epoch}: repeated samples {counts}"


_references: dict = {}


def reference(tmp_path_factory, np: int) -> dict:
    """The final parameters of an uninterrupted run at `np` ranks (run once per module)."""
    if np not in _references:
        out_dir = tmp_path_factory.mktemp(f"reference{np}")
        status, out = launch(out_dir, ["-np", str(np)], "elastic_launch_train.py", out_dir)
        assert status == 0, out
        assert "finished after 0 restart(s)" in out, out
        _references[np] = json.loads((out_dir / "final.json").read_text())
        assert_each_sample_once_per_epoch(steps(out_dir))
    return _references[np]


# A commit every 2 steps and one at each epoch's end: at 2 ranks (6 steps an epoch) the last
# commit before step 5 is the second (after step 4); at 3 ranks (4 steps) the third (step 4 and
# the end of epoch 0).
@pytest.mark.parametrize("np, commit", [(2, 2), (3, 3)])
def test_a_killed_rank_restarts_and_ends_as_an_uninterrupted_run(
    tmp_path, tmp_path_factory, np, commit
):
    expected = reference(tmp_path_factory, np)
    status, out = launch(tmp_path, ["-np", str(np), "--min-np", str(np), "--max-np", str(np)],
                         "elastic_launch_train.py", tmp_path, "--kill-step", 5)  # fmt: skip
    assert status == 0, out
    assert_restarted_for_rank_1(out, "localhost")
    assert f"{np} workers on localhost:{np}, resuming from commit {commit}" in out, out
    final = json.loads((tmp_path / "final.json").read_text())
    assert final == expected, (final, expected)
    records = steps(tmp_path)
    assert {r["restart"] for r in records} == {0, 1}
    assert max(r["step"] for r in records if r["restart"] == 0) == 4, "rank 1 died at step 5"
    assert_each_sample_once_per_epoch(records)


def test_a_job_resized_from_3_to_2_covers_every_sample_once(tmp_path):
    # The discovery script offers 3 slots at the start and 2 from the restart on. Rank 1 dies
    # before step 3 of epoch 0 (4 steps of 3 x 2 samples): the commit after step 2 holds 12
    # processed samples, and 2 ranks deal out the other 12.
    script = discovery(tmp_path, "localhost:3", "localhost:2")
    status, out = launch(tmp_path, ["-np", "3", "--min-np", "2", "--max-np", "3",
                                    "--host-discovery-script", script],
                         "elastic_launch_train.py", tmp_path, "--kill-step", 3)  # fmt: skip
    assert status == 0, out
    assert "2 workers on localhost:2, resuming from commit 1" in out, out
    records = steps(tmp_path)
    assert {(r["restart"], r["size"]) for r in records} == {(0, 3), (1, 2)}
    assert_each_sample_once_per_epoch(records)
    final = json.loads((tmp_path / "final.json").read_text())
    assert final["size"] == 2 and final["steps"] == 2 + 3 + 6, final


def test_discovery_that_adds_a_slot_grows_the_job_at_the_next_commit(tmp_path):
    # A commit every 3 steps of 2 x 2 samples: whichever commit the job grows at, the samples
    # left in the epoch (12 or 0) divide among 3 ranks, so none is dealt out twice.
    script = discovery(tmp_path, "localhost:2", "localhost:3")
    status, out = launch(tmp_path, ["-np", "2", "--min-np", "2", "--max-np", "3",
                                    "--host-discovery-script", script,
                                    "--discovery-interval", "0.2"],
                         "elastic_launch_train.py", tmp_path, "--step-seconds", 0.1,
                         "--commit-every", 3)  # fmt: skip
    assert status == 0, out
    assert "discovery shows 3 usable slots (localhost:3), the job uses 2" in out, out
    assert "restart 1 (hosts added; not counted): 3 workers on localhost:3" in out, out
    records = steps(tmp_path)
    assert {(r["restart"], r["size"]) for r in records} == {(0, 2), (1, 3)}
    # The run at 2 ranks left right after a commit: nothing it did is redone.
    grown_at = min(r["step"] for r in records if r["restart"] == 1) - 1
    assert grown_at == max(r["step"] for r in records if r["restart"] == 0), records
    assert_each_sample_once_per_epoch(records)
    assert json.loads((tmp_path / "final.json").read_text())["size"] == 3


def test_synthetic_benchmark_pattern(tmp_path):
    status, out = launch(tmp_path, ["-np", "2", "--min-np", "1", "--max-np", "2"],
                         "elastic_launch_synthetic.py", "--num-iters", 4,
                         "--kill-iter", 3)  # fmt: skip
    assert status == 0, out
    assert_restarted_for_rank_1(out, "localhost")
    assert "resuming from commit" in out and "Total img/sec on 2 CPU(s)" in out, out
    assert out.count("Iter #") >= 4, out


# -- simulated hosts ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def netns():
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.netns
def test_kill_and_restart_on_two_simulated_hosts(netns, tmp_path, tmp_path_factory):
    expected = reference(tmp_path_factory, 2)
    status, out = launch(tmp_path, ["-np", "2", "--simulated-hosts", "2"],
                         "elastic_launch_train.py", tmp_path, "--kill-step", 5)  # fmt: skip
    assert status == 0, out
    assert "starting 2 workers on host0:1,host1:1" in out, out
    assert_restarted_for_rank_1(out, "host1")
    final = json.loads((tmp_path / "final.json").read_text())
    assert final == expected, (final, expected)
    assert_each_sample_once_per_epoch(steps(tmp_path))


@pytest.mark.netns
def test_a_simulated_host_failing_twice_in_a_row_is_excluded(netns, tmp_path):
    log = tmp_path / "log"
    status, out = launch(tmp_path, ["-np", "4", "--min-np", "2", "--max-np", "4",
                                    "--simulated-hosts", "2"],
                         "elastic_standin.py", log, "kill-host1")  # fmt: skip
    assert status == 0, out
    assert "host host1 excluded: its workers failed in 2 runs in a row" in out, out
    assert "restart 2 (rank" in out and "2 workers on host0:2" in out, out
    runs = [line.split()[:2] for line in log.read_text().splitlines()]
    assert Counter(tuple(r) for r in runs) == {
        ("restart=0", "size=4"): 4, ("restart=1", "size=4"): 4, ("restart=2", "size=2"): 2,
    }, runs  # fmt: skip


def test_keras_fit_survives_a_killed_rank_and_resumes_at_the_committed_epoch(tmp_path):
    # Rank 1 dies inside epoch 2 (0-based): epochs 0 and 1 are committed, epoch 2 is redone.
    status, out = launch(tmp_path, ["-np", "2", "--min-np", "2", "--max-np", "2"],
                         "elastic_launch_keras.py", tmp_path, 4, 2, timeout=240)  # fmt: skip
    assert status == 0, out
    assert_restarted_for_rank_1(out, "localhost")
    starts = sorted((tmp_path / "starts.txt").read_text().splitlines())
    assert starts == [f"restart={r} size=2 rank={rank} start={2 * r}" for r in (0, 1)
                      for rank in (0, 1)], starts  # fmt: skip
    first = (tmp_path / "epochs-0.txt").read_text().split()
    assert sorted(set(w for w in first if w.startswith("epoch="))) == ["epoch=0", "epoch=1"]
    resumed = (tmp_path / "epochs-1.txt").read_text().split()
    assert sorted(set(w for w in resumed if w.startswith("epoch="))) == ["epoch=2", "epoch=3"]
    assert len((tmp_path / "weights.txt").read_text().split()) == 3 * 4 + 4 + 4 + 1


def test_a_jax_job_that_loses_a_rank_resumes_smaller_and_ends_as_one_process(tmp_path):
    # JaxState (parameters, optax state, PRNG key) under hvd.elastic.run: rank 1 of 3 dies
    # before step 5, the job resumes at 2 ranks from the commit after step 4, and its gradient
    # (the batch's mean, summed over the ranks) makes it end where one process ends.
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    reference = tmp_path / "reference"
    reference.mkdir()
    subprocess.run([sys.executable, str(JOBS / "elastic_launch_jax.py"), str(reference),
                    "--reference"], check=True, timeout=120)  # fmt: skip
    script = discovery(tmp_path, "localhost:3", "localhost:2")
    status, out = launch(tmp_path, ["-np", "3", "--min-np", "2", "--max-np", "3",
                                    "--host-discovery-script", script],
                         "elastic_launch_jax.py", tmp_path, "--kill-step", 5)  # fmt: skip
    assert status == 0, out
    assert_restarted_for_rank_1(out, "localhost")
    assert "2 workers on localhost:2, resuming from commit 2" in out, out
    records = steps(tmp_path)
    assert {(r["restart"], r["size"]) for r in records} == {(0, 3), (1, 2)}
    assert max(r["step"] for r in records if r["restart"] == 0) == 4, "rank 1 died at step 5"
    assert min(r["step"] for r in records if r["restart"] == 1) == 5, records
    final = json.loads((tmp_path / "final.json").read_text())
    expected = json.loads((reference / "final.json").read_text())
    assert (final["size"], final["steps"]) == (2, 8), final
    assert final["params"] == pytest.approx(expected["params"], rel=1e-12, abs=1e-12), final


def test_the_elastic_example_runs_through_a_failure(tmp_path):
    # 700 images a rank, 32 a batch: 22 steps an epoch, commits at steps 10, 20 and 22 (the
    # epoch's end); rank 1 dies at step 30, and the job resumes at epoch 1, step 22.
    pytest.importorskip("sklearn")
    example = JOBS.parent.parent / "examples" / "pytorch_elastic.py"
    status, out = launch(tmp_path, ["-np", "2", "--min-np", "1", "--max-np", "2"], str(example),
                         "--epochs", 5, "--fail-at-step", 30)  # fmt: skip
    assert status == 0, out
    assert_restarted_for_rank_1(out, "localhost")
    assert "run 1: 2 ranks from epoch 1, step 22" in out, out
    accuracy = float(re.search(r"test accuracy (\S+) on 2 ranks", out).group(1))
    assert accuracy > 0.8, out
