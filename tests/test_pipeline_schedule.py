"""Single-process tests of the pipeline schedules, balance, layout and checks (no framework)."""

import itertools
import random

import pytest

from horovodlite.training import pipeline_schedule as ps
from horovodlite.training.pipeline_schedule import Op


def all_ops(name, stages, chunks):
    return [ps.schedule(name, stages, chunks, s) for s in range(stages)]


def simulate(name, stages, chunks):
    """Run every stage's ops in unit time slots, each when its inputs exist; return busy/time.

    F(m) on stage s needs F(m) of stage s-1, and B(m) needs B(m) of stage s+1 (or, on the last
    stage, its own F(m)). Returns (finish time, slots each stage was busy); a deadlock fails.
    """
    ops = all_ops(name, stages, chunks)
    done = {}  # (stage, op) -> slot it finished in
    position = [0] * stages
    time = 0
    while any(position[s] < len(ops[s]) for s in range(stages)):
        ran = []
        for s in range(stages):
            if position[s] == len(ops[s]):
                continue
            op = ops[s][position[s]]
            if op.kind == "F":
                needs = [(s - 1, Op("F", op.micro))] if s > 0 else []
            else:
                needs = [(s + 1, Op("B", op.micro))] if s < stages - 1 else []
                needs.append((s, Op("F", op.micro)))
            if all(done.get(n, time + 1) <= time for n in needs):
                ran.append((s, op))
        assert ran, f"{name} deadlocks at slot {time}"
        time += 1
        for s, op in ran:
            done[s, op] = time
            position[s] += 1
    return time, [len(o) for o in ops]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(
    "stages, chunks", [(1, 1), (2, 1), (2, 4), (3, 2), (4, 8), (4, 16), (5, 3)]
)
def test_each_micro_batch_runs_forward_then_backward_once_in_order(name, stages, chunks):
    for ops in all_ops(name, stages, chunks):
        forwards = [op.micro for op in ops if op.kind == "F"]
        backwards = [op.micro for op in ops if op.kind == "B"]
        # Both in micro-batch order: messages between stages arrive as the receiver expects.
        assert forwards == backwards == list(range(chunks))
        assert all(ops.index(Op("F", m)) < ops.index(Op("B", m)) for m in range(chunks))
        assert ops[-1] == Op("B", chunks - 1)  # the last backward is the last op


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, chunks", [(2, 1), (2, 4), (3, 2), (4, 1), (4, 8), (4, 16)])
def test_bubble_of_equal_stages_matches_the_theory(name, stages, chunks):
    finish, busy = simulate(name, stages, chunks)
    assert finish == 2 * (chunks + stages - 1)
    for slots in busy:
        assert 1 - slots / finish == pytest.approx(ps.bubble_fraction(stages, chunks))


@pytest.mark.parametrize("stages, chunks", [(2, 8), (4, 8), (4, 2), (3, 16)])
def test_1f1b_holds_at_most_stages_minus_stage_micro_batches_and_gpipe_all(stages, chunks):
    for s in range(stages):
        assert ps.max_in_flight(ps.one_f_one_b(stages, chunks, s)) == min(stages - s, chunks)
        assert ps.max_in_flight(ps.gpipe(stages, chunks, s)) == chunks


def test_1f1b_of_two_stages():
    assert ps.one_f_one_b(2, 3, 0) == [Op("F", 0), Op("F", 1), Op("B", 0), Op("F", 2),
                                       Op("B", 1), Op("B", 2)]  # fmt: skip
    assert ps.one_f_one_b(2, 3, 1) == [Op("F", 0), Op("B", 0), Op("F", 1), Op("B", 1),
                                       Op("F", 2), Op("B", 2)]  # fmt: skip


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_bad_chunks(bad):
    with pytest.raises(ValueError, match="chunks must be a positive int"):
        ps.schedule("1f1b", 2, bad, 0)


def test_unknown_schedule_names_the_known_ones():
    with pytest.raises(ValueError, match=r"schedule must be one of \['1f1b', 'gpipe'\]"):
        ps.schedule("interleaved", 2, 4, 0)


def brute_force_best(costs, stages):
    best = None
    for cuts in itertools.combinations(range(1, len(costs)), stages - 1):
        bounds = (0, *cuts, len(costs))
        largest = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        best = largest if best is None else min(best, largest)
    return best


def test_balance_by_size_is_optimal_and_contiguous():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        stages = rng.randint(1, n)
        sizes = [rng.choice([0, 1, 5, 40, 300]) for _ in range(n)]
        counts = ps.balance_by_size(sizes, stages)
        assert len(counts) == stages and min(counts) >= 1 and sum(counts) == n
        costs = [max(s, 1) for s in sizes]
        largest = max(sum(costs[a:b]) for a, b in ps.stage_bounds(counts))
        assert largest == brute_force_best(costs, stages), (sizes, stages, counts)


def test_balance_by_size_examples():
    assert ps.balance_by_size([10, 10, 10, 10], 2) == [2, 2]
    assert ps.balance_by_size([100, 1, 1, 1], 2) == [1, 3]
    assert ps.balance_by_size([10, 0, 10, 0], 2) == [2, 2]  # a ReLU costs 1, not nothing
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 stages"):
        ps.balance_by_size([1, 1], 3)


def test_stage_bounds():
    assert ps.stage_bounds([1, 3, 2]) == [(0, 1), (1, 4), (4, 6)]


def test_check_balance():
    assert ps.check_balance((2, 1), 3, 2) == [2, 1]
    with pytest.raises(TypeError, match="balance must be a list"):
        ps.check_balance(3, 3, 1)
    with pytest.raises(TypeError, match="balance must hold ints"):
        ps.check_balance([1.5, 1.5], 3, 2)
    with pytest.raises(ValueError, match="one layer count per stage: 2 counts"):
        ps.check_balance([3], 3, 2)
    with pytest.raises(ValueError, match="at least one layer"):
        ps.check_balance([3, 0], 3, 2)
    with pytest.raises(ValueError, match="adds up to 4 layers, but the model has 3"):
        ps.check_balance([2, 2], 3, 2)


def test_check_stages():
    assert ps.check_stages(None, 4, 6) == 4
    assert ps.check_stages(2, 4, 6) == 2
    with pytest.raises(
        ValueError, match=r"does not divide the 4 ranks: choose stages among \[1, 2, 4\]"
    ):
        ps.check_stages(3, 4, 6)
    with pytest.raises(ValueError, match="3 layers, fewer than stages=4"):
        ps.check_stages(4, 4, 3)
    with pytest.raises(ValueError, match="stages must be a positive int"):
        ps.check_stages(0, 4, 3)


def test_layout_of_two_stages_by_two_replicas():
    where = ps.layout(3, 4, 2)
    assert (where.stage, where.replica) == (1, 1)
    assert where.pipeline_ranks == (2, 3) and where.data_parallel_ranks == (1, 3)
    assert where.all_pipelines == ((0, 1), (2, 3))
    assert where.all_data_parallel == ((0, 2), (1, 3))
    assert ps.layout(2, 4, 4).all_data_parallel == ((0,), (1,), (2,), (3,))


def test_check_batch_table():
    assert ps.check_batch_table([(8, -1), (-1, 8)], 4) == (2, None)
    assert ps.check_batch_table([(8, -2), (8, -2)], 2) == (4, None)  # eval
    cases = [
        ([(8, 8), (6, 6)], ValueError, "stage 1 passed inputs of 6 rows, but stage 0 passed"),
        ([(9, 9)], ValueError, "9 rows does not split into chunks=4"),
        ([(0, 0)], ValueError, "0 rows does not split"),
        ([(-1, 8), (8, 8)], ValueError, "the first stage must pass the inputs"),
        ([(8, 8), (8, -1)], ValueError, "the last stage must pass the targets"),
        ([(8, 8), (-3, 8)], TypeError, "stage 1 passed inputs that are not a tensor"),
    ]
    for rows, kind, text in cases:
        micro, error = ps.check_batch_table(rows, 4)
        assert micro == 0 and isinstance(error, kind) and text in str(error), (rows, error)
