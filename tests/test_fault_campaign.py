"""The fault campaign's judge (benchmarks/fault_campaign.py), on the outputs of trials it got wrong.

Seed 105 of the first campaign (4 ranks, os._exit by rank 2 at step 3, after a torch step) was
counted "late, 65 s after the fault". Its output shows the fault never happened: on a machine
at a load of 30, rank 0 fell more than the 6 s collective timeout behind in the torch step, the
others timed out there naming it, and the job ended; with no fault announced, the time was
counted from the launch. The campaign now gives torch programs a longer timeout and counts a
trial that ends before its fault as such. The elastic judge must tell a job that resumed from
its newest commit from one that lost commits.
"""

import importlib.util
import pathlib

import pytest

PATH = pathlib.Path(__file__).parent.parent / "benchmarks" / "fault_campaign.py"


@pytest.fixture(scope="module")
def campaign():
    spec = importlib.util.spec_from_file_location("fault_campaign", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What seed 105 printed, shortened: three ranks timed out in the torch step waiting for rank 0.
SEED_105 = "".join(
    f"RANK {r} ERROR at step 2 after 29.0 s: HorovodLiteError: allreduce '2.bias': an "
    "asynchronous collective waited over 6 s (HOROVODLITE_COLLECTIVE_TIMEOUT): '0.bias' is "
    "missing ranks [0]; the job is torn down\n"
    f"horovodlite: rank {r} exits on an uncaught HorovodLiteError: aborting the job\n"
    for r in (3, 1, 2)
)


def test_seed_105_ended_before_its_fault_and_is_not_counted_from_the_launch(campaign):
    trial = campaign.draw(105)
    assert (trial["np"], trial["fault"], trial["rank"], trial["at"]) == (4, "os_exit", 2, 3)
    assert trial["steps"][2] == "torch" and not trial["elastic"]
    outcome, why = campaign.judge(trial, 1, SEED_105, 65.45)
    assert outcome == "before the fault", why
    # A torch program waits longer than a rank slowed by load computes its first steps.
    assert campaign.timeout_of(trial) == campaign.TORCH_TIMEOUT > campaign.TIMEOUT


def test_a_late_end_after_the_fault_is_still_late(campaign):
    trial = campaign.draw(105)
    out = "FAULT AT 100.000\nhorovodlite-run: rank 2 (pid 7) ended without leaving horovodlite\n"
    late = campaign.bound_of(trial) + 1
    assert campaign.judge(trial, 9, out, late)[0] == "late"
    assert campaign.judge(trial, 9, out, 1.0)[0] == "error named"


def elastic_output(resumed_from: int) -> str:
    lines = [f"RANK {r} COMMITTED {c} step {c}" for c in (1, 2) for r in (0, 1)]
    lines += ["FAULT AT 100.000"]
    lines += [f"RANK {r} RESUMED commit {resumed_from} step 2 AT 110.000" for r in (0, 1)]
    lines += [f"RANK {r} OK restart 1" for r in (0, 1)]
    return "\n".join(lines) + "\n"


def test_an_elastic_trial_must_resume_from_the_newest_commit(campaign):
    trial = {"np": 2, "fault": "sigkill", "rank": 1, "at": 2, "steps": ["barrier"] * 4,
             "elastic": True}  # fmt: skip
    assert campaign.judge_elastic(trial, 0, elastic_output(2), 10.0)[0] == "resumed"
    assert campaign.judge_elastic(trial, 0, elastic_output(1), 10.0)[0] == "lost"
    assert campaign.judge_elastic(trial, 1, elastic_output(2), 10.0)[0] == "failed"
    slow = campaign.bound_of(trial) + campaign.RESTART + 1
    assert campaign.judge_elastic(trial, 0, elastic_output(2), slow)[0] == "late"


def test_elastic_programs_commit_and_keep_the_earlier_seeds(campaign):
    assert not any(campaign.draw(seed)["elastic"] for seed in range(campaign.ELASTIC_FROM))
    elastic = [campaign.draw(seed) for seed in range(300, 400)]
    elastic = [trial for trial in elastic if trial["elastic"]]
    assert 20 <= len(elastic) <= 50
    assert all(len(t["commits"]) == len(t["steps"]) for t in elastic)
    assert any(t["steps"].count("torch") == 2 for t in elastic)
