"""Process sets: registration, collectives on a subgroup with global root ranks, removal."""

import numpy as np
import pytest
from mpi4py import MPI
from oracle import WORLD, assert_reduced, expect_error_everywhere, rank_values, reduce_expected
from oracle import still_in_step as world_still_in_step

import horovodlite as hvd


def needs(count: int):
    return pytest.mark.skipif(WORLD.size < count, reason=f"needs {count} ranks")


@pytest.fixture
def registered():
    """Register process sets by ranks; remove them after the test, on every rank."""
    created = []

    def add(ranks):
        process_set = hvd.add_process_set(ranks)
        created.append(process_set)
        return process_set

    yield add
    for process_set in created:
        hvd.remove_process_set(process_set)


def member_inputs(x, members: list) -> list:
    """Return the members' `x` in set order (gathered over the world with mpi4py)."""
    gathered = WORLD.allgather(x)
    return [gathered[k] for k in members]


def test_global_process_set():
    n, r = hvd.size(), hvd.rank()
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(n))
    assert hvd.global_process_set.size() == n
    assert hvd.global_process_set.rank() == r
    assert hvd.global_process_set.included()
    assert hvd.remove_process_set(hvd.global_process_set) is False
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=hvd.global_process_set)
    np.testing.assert_array_equal(out, [n, n])


@needs(3)
def test_ranks_0_and_2(registered):
    r = hvd.rank()
    ps = registered([2, 0, 0])  # order and repeats do not matter
    members = [0, 2]
    assert ps.ranks == members and ps.size() == 2
    assert ps.included() == (r in members)
    assert ps.rank() == (members.index(r) if r in members else -1)
    if ps.included():
        collectives_on_ranks_0_and_2(ps, members)
    else:
        with pytest.raises(ValueError, match=f"rank {r} is not in process set \\[0, 2\\]"):
            hvd.allreduce(np.ones(2), process_set=ps)
        with pytest.raises(ValueError, match="not in process set"):
            hvd.barrier(process_set=ps)
    world_still_in_step()


def collectives_on_ranks_0_and_2(ps, members):
    r = hvd.rank()
    x = rank_values((5, 2), np.float32, r, seed=20)
    inputs = hvd.allgather_object(x, process_set=ps)
    for k, value in zip(members, inputs):
        np.testing.assert_array_equal(value, rank_values((5, 2), np.float32, k, seed=20))
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        for algorithm in ("ring", "naive", "mpi", None):
            out = hvd.allreduce(x, op=op, process_set=ps, algorithm=algorithm)
            assert_reduced(out, reduce_expected(inputs, op), op)
    # Root ranks are global ranks: rank 2 is the set's second member.
    out = hvd.broadcast(x, root_rank=2, process_set=ps)
    np.testing.assert_array_equal(out, inputs[1])
    assert hvd.broadcast_object(f"from {r}", root_rank=2, process_set=ps) == "from 2"
    with pytest.raises(ValueError, match="root_rank 1 is not a rank of this process set"):
        hvd.broadcast(x, root_rank=1, process_set=ps)
    gathered = hvd.allgather(x[: r + 1], process_set=ps)
    np.testing.assert_array_equal(gathered, np.concatenate([inputs[0][:1], inputs[1][:3]]))
    out = hvd.reducescatter(x, op=hvd.Sum, process_set=ps)
    expected = reduce_expected(inputs, hvd.Sum)
    np.testing.assert_array_equal(out, expected[:3] if r == 0 else expected[3:])
    received = hvd.alltoall(np.array([[r], [r + 10]]), process_set=ps)
    assert received.ravel().tolist() == ([0, 2] if r == 0 else [10, 12])
    hvd.barrier(process_set=ps)
    assert hvd.allgather_object(r, process_set=ps) == members


def test_one_rank_per_set(registered):
    n, r = hvd.size(), hvd.rank()
    sets = [registered([k]) for k in range(n)]  # every rank registers every set, in order
    mine = sets[r]
    assert [s.included() for s in sets] == [k == r for k in range(n)]
    out = hvd.allreduce(np.array([r, 1.0]), op=hvd.Sum, process_set=mine)
    np.testing.assert_array_equal(out, [r, 1.0])
    np.testing.assert_array_equal(hvd.broadcast(np.array([r]), r, process_set=mine), [r])
    assert hvd.allgather_object("x", process_set=mine) == ["x"]
    world_still_in_step()


@needs(2)
def test_even_and_odd_ranks(registered):
    n, r = hvd.size(), hvd.rank()
    evens, odds = registered(range(0, n, 2)), registered(range(1, n, 2))
    mine, members = (evens, list(range(0, n, 2))) if r % 2 == 0 else (odds, list(range(1, n, 2)))
    assert mine.included() and not (odds if r % 2 == 0 else evens).included()
    x = rank_values((7,), np.int64, r, seed=21)
    inputs = member_inputs(x, members)
    out = hvd.allreduce(x, op=hvd.Sum, process_set=mine, name="half")
    assert_reduced(out, reduce_expected(inputs, hvd.Sum))
    out = hvd.broadcast(x, root_rank=members[-1], process_set=mine)
    np.testing.assert_array_equal(out, inputs[-1])
    world_still_in_step()



@needs(3)
def test_unnamed_requests_on_a_set_leave_the_world_s_names_in_step(registered):
    # Unnamed async requests are named in submission order. Those on a set are counted per set:
    # counted with the world's, the ranks outside the set would name the world's next request
    # differently from its members, and they would never meet.
    n, r = hvd.size(), hvd.rank()
    evens = registered(range(0, n, 2))
    if evens.included():
        handle = hvd.allreduce_async(np.ones(3), op=hvd.Sum, process_set=evens)
        np.testing.assert_array_equal(hvd.synchronize(handle), [len(range(0, n, 2))] * 3)
    handle = hvd.allreduce_async(np.full(2, float(r)), op=hvd.Sum)
    np.testing.assert_array_equal(hvd.synchronize(handle), [n * (n - 1) / 2] * 2)
    world_still_in_step()

@needs(3)
def test_mismatch_inside_a_set_names_global_ranks(registered):
    n, r = hvd.size(), hvd.rank()
    members = list(range(1, n))  # the set leaves out rank 0, so set ranks differ from global
    ps = registered(members)
    if ps.included():
        odd, others = members[-1], members[:-1]
        shape = (4,) if r == odd else (3,)
        listed = f"rank {others[0]}" if len(others) == 1 else "ranks " + ", ".join(map(str, others))
        text = expect_error_everywhere(
            lambda: hvd.allreduce(np.ones(shape), process_set=ps), set(), None,
            f"rank {odd} sent", f"{listed} sent", "(4,)", "(3,)",
        )  # fmt: skip
        assert "rank 0" not in text, f"rank 0 is not in the set, yet named: {text}"
    world_still_in_step()


def test_process_set_from_communicator(registered):
    n = hvd.size()
    ps = hvd.ProcessSet(MPI.COMM_WORLD)
    assert ps.ranks == list(range(n))
    ps = registered(ps)
    assert ps.process_set_id not in (None, 0)
    np.testing.assert_array_equal(hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=ps), [n])


def test_remove_process_set():
    n = hvd.size()
    ps = hvd.add_process_set(list(range(n)))
    ps_id = ps.process_set_id
    assert ps_id is not None and ps_id > 0
    assert hvd.remove_process_set(ps) is True
    assert ps.process_set_id is None
    assert ps.ranks == list(range(n))  # it remembers its ranks
    assert hvd.remove_process_set(ps) is False
    with pytest.raises(ValueError, match="is not registered"):
        hvd.allreduce(np.ones(1), process_set=ps)
    # Registering it again gives it a new id; ids are never reused.
    again = hvd.add_process_set(ps)
    assert again is ps and ps.process_set_id > ps_id
    with pytest.raises(ValueError, match="already registered"):
        hvd.add_process_set(ps)
    assert hvd.remove_process_set(ps) is True
    world_still_in_step()


def test_every_collective_communicator_has_its_checks_bound():
    # The checks of every communicator that carries synchronous collectives start one persistent
    # all-gather (agreement.bind); a set's are released with it, before its communicators are
    # freed, so a handle MPI hands out again is never taken for a bound one.
    from horovodlite import agreement
    from horovodlite.state import current

    n = hvd.size()
    state = current()
    assert (state.comm.handle in agreement._bound) == (n > 1)
    ps = hvd.add_process_set(list(range(n)))
    entry = state.process_sets.lookup(ps.process_set_id)
    handle = entry.comm.handle
    assert (handle in agreement._bound) == (n > 1)
    r = hvd.rank()
    base = rank_values((5,), np.float64, r, seed=91)
    for _ in range(3):  # the same persistent request, started again each time
        out = hvd.allreduce(base, op=hvd.Sum, process_set=ps, name="bound.set")
        assert_reduced(out, reduce_expected(WORLD.allgather(base), hvd.Sum), hvd.Sum)
    assert hvd.remove_process_set(ps) is True
    assert handle not in agreement._bound
    # A communicator of the caller's own is not bound: its checks post an all-gather each.
    own = WORLD.Dup()
    try:
        assert own.handle not in agreement._bound
        digests, payloads = agreement.exchange(own, 42, r)
        assert digests == [42] * n and payloads == list(range(n))
    finally:
        own.Free()
    world_still_in_step()


def test_bad_registrations_fail_on_every_rank():
    n, r = hvd.size(), hvd.rank()
    with pytest.raises(ValueError, match=f"must lie in 0..{n - 1}"):
        hvd.add_process_set([0, n])
    with pytest.raises(ValueError, match="must lie in"):
        hvd.add_process_set([])
    with pytest.raises(TypeError, match="list of ranks or an mpi4py communicator"):
        hvd.ProcessSet(3)
    with pytest.raises(TypeError, match="must be a ProcessSet"):
        hvd.allreduce(np.ones(1), process_set="everyone")
    if n > 1:
        # One rank asks for other ranks than the rest: nobody registers anything.
        ranks = [0] if r == n - 1 else [0, 1]
        expect_error_everywhere(
            lambda: hvd.add_process_set(ranks),
            set(),
            None,
            f"rank {n - 1} sent",
            "ranks (0,",
            "(0,)",
        )
    world_still_in_step()
