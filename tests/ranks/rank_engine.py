"""The engine on every rank: async collectives submitted in a different order on each rank, from
several threads, with and without fusion; mismatches, duplicate names, join, sync interleaving.

numpy computes every expected result from the inputs (`rank_values` is the same on every rank),
so no MPI call is trusted as the oracle here.
"""

import dataclasses
import gc
import threading
import time
import weakref

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI
from oracle import (
    DTYPES,
    assert_reduced,
    everyone,
    expect_error_everywhere,
    rank_values,
    reduce_expected,
    still_in_step,
)

import horovodlite as hvd
from horovodlite import fusion
from horovodlite.algorithms.pieces import Pieces
from horovodlite.asynchronous import repeated_allreduce_plan
from horovodlite.collectives import allreduce_plan
from horovodlite.fusion import adjacent_span
from horovodlite.wakeup import GATHER_ONE_HOST

THREADS = 3
WORLD_SIZE = MPI.COMM_WORLD.Get_size()  # known before the session's init()


def engine():
    return hvd.state.current().engine


def rows_of(count: int, parts: int) -> list:
    """Return Horovod's split of `count` rows over `parts` ranks: the first count % parts get one
    more."""
    base, extra = divmod(count, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


# ---------------------------------------------------------------------------------------------
# Cases: (name, submit() -> Handle, check(result)). Built identically on every rank; only members
# of a case's ranks submit it.


def allreduce_cases(ranks, process_set, tag: str) -> list:
    me = hvd.rank()
    cases = []
    ops = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]
    for i, dtype in enumerate(DTYPES):
        for op in ops:
            if dtype == np.bool_ and op == hvd.Average:
                continue
            shape = [(3, 5), (7,), (0,), (), (2, 1, 3)][(i + op.value) % 5]
            name = f"{tag}.allreduce.{dtype}.{op.name}"
            seed = 100 + i

            def submit(shape=shape, dtype=dtype, op=op, name=name, seed=seed):
                x = rank_values(shape, dtype, me, seed)
                return hvd.allreduce_async(x, op=op, name=name, process_set=process_set)

            def check(out, shape=shape, dtype=dtype, op=op, seed=seed):
                inputs = [rank_values(shape, dtype, k, seed) for k in ranks]
                assert_reduced(out, reduce_expected(inputs, op), op)

            cases.append((name, submit, check))
    # Scaled, in place, and grouped forms.
    for inplace in (False, True):
        name = f"{tag}.scaled.{inplace}"

        def submit(inplace=inplace, name=name):
            x = rank_values((4, 6), np.float64, me, 7)
            call = hvd.allreduce_async_ if inplace else hvd.allreduce_async
            handle = call(x, op=hvd.Average, name=name, prescale_factor=0.5,
                          postscale_factor=3.0, process_set=process_set)  # fmt: skip
            if inplace:
                handle = InPlace(handle, x)
            return handle

        def check(out):
            inputs = [rank_values((4, 6), np.float64, k, 7) for k in ranks]
            assert_reduced(out, reduce_expected(inputs, hvd.Average, 0.5, 3.0), hvd.Average)

        cases.append((name, submit, check))
    for inplace in (False, True):
        name = f"{tag}.grouped.{inplace}"
        shapes = [(3,), (2, 4), (0,), (5, 1)]

        def submit(inplace=inplace, name=name, shapes=shapes):
            xs = [rank_values(s, np.int32, me, 20 + j) for j, s in enumerate(shapes)]
            call = hvd.grouped_allreduce_async_ if inplace else hvd.grouped_allreduce_async
            handle = call(xs, op=hvd.Sum, name=name, process_set=process_set)
            if inplace:
                handle = InPlace(handle, xs)
            return handle

        def check(outs, shapes=shapes):
            assert len(outs) == len(shapes)
            for j, (out, s) in enumerate(zip(outs, shapes)):
                inputs = [rank_values(s, np.int32, k, 20 + j) for k in ranks]
                assert_reduced(out, reduce_expected(inputs, hvd.Sum))

        cases.append((name, submit, check))
    return cases


def data_cases(ranks, process_set, tag: str) -> list:
    n, me = len(ranks), hvd.rank()
    position = ranks.index(me)
    cases = []
    dtype = ml_dtypes.bfloat16

    # allgather: rank k (position p) has p rows (the first has none).
    def gather_expected(seed, trailing=(2,)):
        parts = [rank_values((p, *trailing), dtype, k, seed) for p, k in enumerate(ranks)]
        return np.concatenate(parts)

    def submit_gather():
        x = rank_values((position, 2), dtype, me, 30)
        return hvd.allgather_async(x, name=f"{tag}.allgather", process_set=process_set)

    def check_gather(out):
        np.testing.assert_array_equal(out, gather_expected(30))
        assert out.dtype == dtype

    cases.append((f"{tag}.allgather", submit_gather, check_gather))

    def submit_grouped_gather():
        xs = [
            rank_values((position, 2), dtype, me, 31),
            rank_values((position, 1, 3), dtype, me, 32),
        ]
        return hvd.grouped_allgather_async(xs, name=f"{tag}.gg", process_set=process_set)

    def check_grouped_gather(outs):
        np.testing.assert_array_equal(outs[0], gather_expected(31))
        np.testing.assert_array_equal(outs[1], gather_expected(32, (1, 3)))

    cases.append((f"{tag}.gg", submit_grouped_gather, check_grouped_gather))

    for inplace, root in ((False, ranks[-1]), (True, ranks[0])):
        name = f"{tag}.broadcast.{inplace}"

        def submit(inplace=inplace, root=root, name=name):
            x = rank_values((3, 2), np.float16, me, 40)
            call = hvd.broadcast_async_ if inplace else hvd.broadcast_async
            handle = call(x, root, name=name, process_set=process_set)
            if inplace:
                handle = InPlace(handle, x)
            return handle

        def check(out, root=root):
            np.testing.assert_array_equal(out, rank_values((3, 2), np.float16, root, 40))

        cases.append((name, submit, check))

    rows = 2 * n + 1
    split = rows_of(rows, n)
    start = sum(split[:position])

    def submit_scatter():
        x = rank_values((rows, 3), np.int64, me, 50)
        return hvd.reducescatter_async(x, op=hvd.Sum, name=f"{tag}.rs", process_set=process_set)

    def check_scatter(out):
        full = reduce_expected([rank_values((rows, 3), np.int64, k, 50) for k in ranks], hvd.Sum)
        assert_reduced(out, full[start : start + split[position]])

    cases.append((f"{tag}.rs", submit_scatter, check_scatter))

    def submit_grouped_scatter():
        xs = [rank_values((rows, 2), np.float32, me, 51), rank_values((rows,), np.float32, me, 52)]
        return hvd.grouped_reducescatter_async(
            xs, op=hvd.Average, name=f"{tag}.grs", process_set=process_set
        )

    def check_grouped_scatter(outs):
        for out, seed, shape in zip(outs, (51, 52), ((rows, 2), (rows,))):
            full = [rank_values(shape, np.float32, k, seed) for k in ranks]
            expected = reduce_expected(full, hvd.Average)
            assert_reduced(out, expected[start : start + split[position]], hvd.Average)

    cases.append((f"{tag}.grs", submit_grouped_scatter, check_grouped_scatter))

    def submit_alltoall():
        x = rank_values((2 * n, 2), np.uint16, me, 60)
        return hvd.alltoall_async(x, name=f"{tag}.a2a", process_set=process_set)

    def check_alltoall(out):
        parts = [rank_values((2 * n, 2), np.uint16, k, 60)[2 * position : 2 * position + 2]
                 for k in ranks]  # fmt: skip
        np.testing.assert_array_equal(out, np.concatenate(parts))

    cases.append((f"{tag}.a2a", submit_alltoall, check_alltoall))

    def splits_of(p):  # what position p sends to each position
        return [(p + q) % 3 for q in range(n)]

    def submit_alltoallv():
        splits = splits_of(position)
        x = rank_values((sum(splits), 2), np.int8, me, 61)
        return hvd.alltoall_async(x, splits=splits, name=f"{tag}.a2av", process_set=process_set)

    def check_alltoallv(result):
        out, received = result
        parts = []
        for p, k in enumerate(ranks):
            splits = splits_of(p)
            offset = sum(splits[:position])
            parts.append(rank_values((sum(splits), 2), np.int8, k, 61)[offset:][: splits[position]])
        np.testing.assert_array_equal(out, np.concatenate(parts))
        np.testing.assert_array_equal(received, [splits_of(p)[position] for p in range(n)])

    cases.append((f"{tag}.a2av", submit_alltoallv, check_alltoallv))
    return cases


class InPlace:
    """A handle of an in-place form, with the inputs its result must be."""

    def __init__(self, handle, inputs):
        self.handle, self.inputs = handle, inputs


def run_shuffled(cases: list, seed: int) -> None:
    """Submit `cases` in a random order (different on every rank) from THREADS threads, then
    synchronize them in another random order and check every result."""
    rng = np.random.default_rng([seed, hvd.rank()])
    order = rng.permutation(len(cases))
    handles, errors = {}, []

    def submitter(indices):
        try:
            for i in indices:
                name, submit, _ = cases[i]
                handles[name] = submit()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [
        threading.Thread(target=submitter, args=(order[t::THREADS],)) for t in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for i in rng.permutation(len(cases)):
        name, _, check = cases[i]
        handle = handles[name]
        inplace = handle.inputs if type(handle) is InPlace else None
        handle = handle.handle if inplace is not None else handle
        result = hvd.synchronize(handle)
        assert hvd.poll(handle)
        if inplace is not None:  # in-place forms return their inputs
            if isinstance(result, list):
                assert all(r is x for r, x in zip(result, inplace)), name
            else:
                assert result is inplace, name
        try:
            check(result)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None


@pytest.fixture(params=["default", 0, 100], ids=lambda p: f"fusion={p}")
def fusion_threshold(request):
    """Set the engine's fusion threshold on every rank (no request in flight), then restore it."""
    eng = engine()
    before = eng.fusion_threshold
    if request.param != "default":
        eng.fusion_threshold = request.param
    hvd.barrier()  # every rank's engine sees the new threshold before anything is submitted
    yield eng.fusion_threshold
    eng.fusion_threshold = before
    hvd.barrier()


@pytest.fixture(params=[True, False], ids=lambda p: f"overlap={p}")
def overlap(request):
    """Run with background cycles (a spare core) and without (cycles when results are awaited)."""
    eng = engine()
    before, eng.overlap = eng.overlap, request.param
    hvd.barrier()
    yield request.param
    eng.overlap = before
    hvd.barrier()


def test_every_async_collective_in_random_order_from_threads(fusion_threshold, overlap):
    world = list(range(hvd.size()))
    cases = allreduce_cases(world, hvd.global_process_set, "w")
    cases += data_cases(world, hvd.global_process_set, "w")
    run_shuffled(cases, seed=1)
    run_shuffled(cases, seed=2)  # again: now every name is in the cache


def test_inplace_forms_return_their_input():
    x = rank_values((5,), np.float32, hvd.rank(), 3)
    assert hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum, name="ip.ar")) is x
    xs = [x, x[:2].copy()]
    outs = hvd.synchronize(hvd.grouped_allreduce_async_(xs, op=hvd.Sum, name="ip.g"))
    assert outs[0] is xs[0] and outs[1] is xs[1]
    y = rank_values((2,), np.int16, hvd.rank(), 4)
    assert hvd.synchronize(hvd.broadcast_async_(y, 0, name="ip.b")) is y
    np.testing.assert_array_equal(y, rank_values((2,), np.int16, 0, 4))


@pytest.fixture(scope="module")
def even_ranks():
    process_set = hvd.add_process_set(list(range(0, hvd.size(), 2)))
    yield process_set
    hvd.remove_process_set(process_set)


def test_process_sets_beside_the_global_set(even_ranks):
    ranks = even_ranks.ranks
    cases = []
    if hvd.rank() in ranks:
        cases += allreduce_cases(ranks, even_ranks, "even")[-6:]
        cases += data_cases(ranks, even_ranks, "even")
    world = list(range(hvd.size()))
    cases += allreduce_cases(world, hvd.global_process_set, "ps.w")[:12]
    run_shuffled(sorted(cases, key=lambda case: case[0]), seed=3)


def test_poll_is_false_until_every_rank_submits():
    if hvd.size() < 2:
        pytest.skip("needs two ranks")
    x = np.ones(3, dtype=np.float32)
    handle = None
    if hvd.rank() == 0:
        handle = hvd.allreduce_async(x, op=hvd.Sum, name="poll.late")
        assert not hvd.poll(handle)
    hvd.barrier()  # the other ranks submit only after rank 0 has polled
    if hvd.rank() != 0:
        handle = hvd.allreduce_async(x, op=hvd.Sum, name="poll.late")
    np.testing.assert_array_equal(hvd.synchronize(handle), np.full(3, hvd.size()))
    assert hvd.poll(handle)


def test_fused_and_unfused_results_are_equal_bitwise():
    shapes = [(17,), (3, 300), (1,), (64, 64), (5,)]
    eng = engine()
    results = {}
    for threshold in (eng.fusion_threshold, 0):
        before, eng.fusion_threshold = eng.fusion_threshold, threshold
        hvd.barrier()
        try:
            xs = [(rank_values(s, np.float32, hvd.rank(), 70 + i) / 8).astype(np.float32)
                  for i, s in enumerate(shapes)]  # fmt: skip
            handles = [hvd.allreduce_async(x, op=hvd.Average, name=f"bits.{i}", prescale_factor=3)
                       for i, x in enumerate(xs)]  # fmt: skip
            results[threshold] = [hvd.synchronize(h) for h in handles]
        finally:
            eng.fusion_threshold = before
            hvd.barrier()
    fused, unfused = results.values()
    for a, b in zip(fused, unfused):
        assert a.tobytes() == b.tobytes()


def test_arrays_back_to_back_are_reduced_where_they_lie_beside_ranks_that_copy(monkeypatch):
    # Even ranks pass views lying back to back in one buffer, in submission order, which the
    # engine reduces where they lie; odd ranks pass separate arrays, which go through a fusion
    # buffer. MPI's own all-reduce takes the batch as one buffer (the ring's pieces are the
    # test below). Both must reduce the same elements together, at every step.
    shapes = [(7,), (3, 5), (1,), (40, 3), (2, 2, 2)]  # sizes that no rank count divides
    bounds = np.cumsum([int(np.prod(s)) for s in shapes])
    spans = []  # what fusion.adjacent_span returned for each fused batch

    def spy(entries):
        span = adjacent_span(entries)
        if len(entries) > 1:  # (a single array lies where it is whatever the layout)
            spans.append(span)
        return span

    monkeypatch.setattr(fusion, "adjacent_span", spy)
    adjacent, flat = hvd.rank() % 2 == 0, np.empty(bounds[-1], np.float64)
    for step in range(3):  # the first cycle agrees on the order; later ones take the cache's
        seeds = [90 + 10 * step + i for i in range(len(shapes))]
        values = [rank_values(s, np.float64, hvd.rank(), seed) for s, seed in zip(shapes, seeds)]
        xs = [v.copy() for v in values]
        if adjacent:
            xs = [part.reshape(s) for part, s in zip(np.split(flat, bounds[:-1]), shapes)]
            for x, v in zip(xs, values):
                x[...] = v
        handles = [hvd.allreduce_async_(x, op=hvd.Average, name=f"adjacent.{i}", algorithm="mpi")
                   for i, x in enumerate(xs)]  # fmt: skip
        for i, (handle, x) in enumerate(zip(handles, xs)):
            assert hvd.synchronize(handle) is x
            everyone = [rank_values(shapes[i], np.float64, r, seeds[i]) for r in range(hvd.size())]
            np.testing.assert_allclose(x, np.mean(everyone, axis=0), rtol=1e-12)
    if adjacent and hvd.size() > 1:
        assert any(span is not None and np.shares_memory(span, flat) for span in spans)
    if not adjacent:
        assert all(span is None for span in spans)


def test_the_ring_reduces_large_arrays_where_they_lie_beside_ranks_laid_out_otherwise(monkeypatch):
    # In a fused batch that the ring moves, arrays of ALONE_BYTES or more are pieces of their
    # own, reduced where they lie if in place; runs of smaller ones share a piece, in the fusion
    # buffer unless they lie back to back. Ranks lay their arrays out three ways: back to back
    # in one buffer, separate, and out of place or strided. All must reduce the same elements
    # together, to the same bits, through the engine (async) and grouped_allreduce (sync).
    monkeypatch.setattr(fusion, "ALONE_BYTES", 64)  # 8 float64s
    # 5 elements: pieces cut segments too (the MPI transport's, made from the settings).
    state = hvd.state.current()
    settings = dataclasses.replace(state.settings, ring_segment_bytes=40)
    monkeypatch.setattr(state, "settings", settings)
    shapes = [(3,), (9,), (2, 7), (1,), (2,), (5, 3), (4,), (11,), (8,)]
    # The pieces: [3], [9], [14], [1, 2], [15], [4], [11], [8] elements. Separate in-place
    # arrays lie where they are if alone in their piece (large, or a lone small one); the run of
    # two small ones is copied.
    alone = [True, True, True, False, False, True, True, True, True]
    bounds = np.cumsum([int(np.prod(s)) for s in shapes])
    pieces = []  # what the ring was given, each fused batch

    def spy(arrays):
        pieces.append(Pieces(arrays))
        return pieces[-1]

    monkeypatch.setattr(fusion, "Pieces", spy)
    layout, flat = hvd.rank() % 3, np.empty(bounds[-1])
    for step in range(4):  # steps 0 and 1 through the engine, 2 and 3 grouped
        seeds = [200 + 10 * step + i for i in range(len(shapes))]
        values = [rank_values(s, np.float64, hvd.rank(), seed) for s, seed in zip(shapes, seeds)]
        if layout == 0:
            xs = [part.reshape(s) for part, s in zip(np.split(flat, bounds[:-1]), shapes)]
        elif layout == 1:
            xs = [np.empty(s) for s in shapes]
        else:  # every other one strided (in place), the rest out of place
            xs = [np.empty((2, *s))[0] if i % 2 else np.empty(s) for i, s in enumerate(shapes)]
        for x, v in zip(xs, values):
            x[...] = v
        in_place = [layout < 2 or i % 2 == 1 for i in range(len(shapes))]
        options = dict(op=hvd.Average, prescale_factor=3.0, algorithm="ring")
        if step < 2:
            submit = [hvd.allreduce_async_ if own else hvd.allreduce_async for own in in_place]
            handles = [start(x, name=f"pieces.{i}", **options)
                       for i, (start, x) in enumerate(zip(submit, xs))]  # fmt: skip
            results = [hvd.synchronize(handle) for handle in handles]
        else:  # grouped calls are all in place or none: the third layout's are none
            results = hvd.grouped_allreduce(xs, name="pieces", inplace=layout < 2, **options)
            in_place = [layout < 2] * len(shapes)
        for i, result in enumerate(results):
            assert (result is xs[i]) == in_place[i]
            everyone_input = [rank_values(shapes[i], np.float64, r, seeds[i])
                              for r in range(hvd.size())]  # fmt: skip
            np.testing.assert_allclose(result, 3 * np.mean(everyone_input, axis=0), rtol=1e-12)
            assert all(other.tobytes() == result.tobytes() for other in everyone(result))
        if hvd.size() == 1:
            continue  # one rank has no ring to run
        lies = [any(np.shares_memory(a, x) for a in pieces[-1].arrays) for x in xs]
        if layout == 0:
            assert all(np.shares_memory(a, flat) for a in pieces[-1].arrays)
        elif layout == 1:
            assert lies == alone
        else:
            assert not any(lies[i] for i in range(len(shapes)) if not in_place[i])
    assert len(pieces) == (4 if hvd.size() > 1 else 0)  # one fused batch each step


# ---------------------------------------------------------------------------------------------
# Errors: raised on every rank by synchronize(), never a hang.


def mismatch_cases(n: int, last: int) -> list:
    me = hvd.rank()
    odd = me == last
    return [
        ("shape", lambda: hvd.allreduce_async(np.zeros(4 if odd else 3), name="mm.shape"),
         ["'mm.shape'", f"rank {last}", "shape", "(4,)", "(3,)"]),
        ("dtype", lambda: hvd.allreduce_async(
            np.zeros(3, np.float64 if odd else np.float32), name="mm.dtype"),
         ["'mm.dtype'", f"rank {last}", "dtype", "'float64'", "'float32'"]),
        ("op", lambda: hvd.allreduce_async(
            np.zeros(3), op=hvd.Max if odd else hvd.Sum, name="mm.op"),
         ["'mm.op'", f"rank {last}", "op", "'MAX'", "'SUM'"]),
        ("root", lambda: hvd.broadcast_async(np.zeros(3), 1 if odd else 0, name="mm.root"),
         ["'mm.root'", f"rank {last}", "root_rank", "1"]),
        ("kind", lambda: (hvd.allgather_async if odd else hvd.allreduce_async)(
            np.zeros(3), name="mm.kind"),
         ["'mm.kind'", f"rank {last}", "collective", "'allgather'", "'allreduce'"]),
        ("trailing", lambda: hvd.allgather_async(np.zeros((2, 3 if odd else 2)), name="mm.tr"),
         ["'mm.tr'", f"rank {last}", "trailing_shape", "(3,)", "(2,)"]),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(6))
def test_mismatch_raises_on_every_rank(index):
    n = hvd.size()
    if n < 2:
        pytest.skip("a mismatch needs two ranks")
    what, submit, fragments = mismatch_cases(n, n - 1)[index]
    handle = submit()  # submitting never raises: the ranks find out together
    text = expect_error_everywhere(lambda: hvd.synchronize(handle), set(), None, *fragments)
    assert "every rank must call the same collectives" in text, what
    still_in_step()
    again = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="mm.after")
    np.testing.assert_array_equal(hvd.synchronize(again), [n, n])


def test_bad_argument_on_one_rank_raises_on_every_rank():
    n, me = hvd.size(), hvd.rank()
    last = n - 1
    frozen = np.zeros(3)
    frozen.flags.writeable = me != last
    handle = hvd.allreduce_async_(frozen, name="bad.readonly")
    expect_error_everywhere(lambda: hvd.synchronize(handle), {last}, ValueError,
                            f"rank {last} failed before sending", "read-only")  # fmt: skip
    splits = [1] * n if me != last else [2] * n
    handle = hvd.alltoall_async(np.zeros((n, 2)), splits=splits, name="bad.splits")
    expect_error_everywhere(lambda: hvd.synchronize(handle), {last}, ValueError,
                            f"rank {last} failed before sending", "add up to")  # fmt: skip
    # A bad argument inside a group fails the whole group, on every rank.
    xs = [np.zeros(2, bool), np.zeros(2, bool)]
    op = hvd.Average if me == last else hvd.Sum
    handle = hvd.grouped_allreduce_async(xs, op=op, name="bad.group")
    expect_error_everywhere(lambda: hvd.synchronize(handle), {last}, TypeError,
                            f"rank {last} failed before sending", "Average of bool")  # fmt: skip
    still_in_step()


@pytest.mark.skipif(WORLD_SIZE < 2, reason="needs two ranks: one rank's request ends at once")
def test_duplicate_name_in_flight_is_a_value_error():
    # A request stays in flight until every rank has submitted it. The last rank submits after
    # the others have checked (after the barrier), so nothing completes in between, however
    # loaded the machine.
    x, last = np.ones(3), hvd.rank() == hvd.size() - 1
    if not last:
        handle = hvd.allreduce_async(x, op=hvd.Sum, name="dup")
        with pytest.raises(ValueError, match="'dup' is already in flight"):
            hvd.allreduce_async(x, op=hvd.Sum, name="dup")
        with pytest.raises(ValueError, match="already in flight"):
            hvd.broadcast_async(x, 0, name="dup")
        group = hvd.grouped_allreduce_async([x, x], op=hvd.Sum, name="dupg")
        with pytest.raises(ValueError, match="'dupg.1' is already in flight"):
            hvd.allreduce_async(x, op=hvd.Sum, name="dupg.1")
        with pytest.raises(ValueError, match="'dupg.0' is already in flight"):
            hvd.grouped_allreduce_async([x, x, x], op=hvd.Sum, name="dupg")
    hvd.barrier()
    if last:
        handle = hvd.allreduce_async(x, op=hvd.Sum, name="dup")
        group = hvd.grouped_allreduce_async([x, x], op=hvd.Sum, name="dupg")
    # The refused group submitted nothing: 'dupg.2' is still free.
    third = hvd.allreduce_async(x, op=hvd.Sum, name="dupg.2")
    np.testing.assert_array_equal(hvd.synchronize(handle), np.full(3, hvd.size()))
    assert len(hvd.synchronize(group)) == 2
    np.testing.assert_array_equal(hvd.synchronize(third), np.full(3, hvd.size()))
    # Once synchronized, the name is free again.
    again = hvd.allreduce_async(x, op=hvd.Sum, name="dup")
    np.testing.assert_array_equal(hvd.synchronize(again), np.full(3, hvd.size()))


# Each kind: (start it, its result from every rank's input).
STARTS = {
    "allreduce": (lambda x, name: hvd.allreduce_async(x, op=hvd.Sum, name=name), sum),
    "allgather": (lambda x, name: hvd.allgather_async(x, name=name), np.concatenate),
    "broadcast": (lambda x, name: hvd.broadcast_async(x, 0, name=name), lambda xs: xs[0]),
}


def wait_until_finished(handle) -> None:
    """Wait for `handle`'s collective without synchronizing it (poll() only asks)."""
    deadline = time.monotonic() + 60  # a guard against a hang only
    while not hvd.poll(handle) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert hvd.poll(handle), "the collective never finished"


@pytest.mark.parametrize("kind", list(STARTS))
def test_a_finished_name_is_free_again_without_synchronize(kind):
    start, result_of = STARTS[kind]
    inputs = [[rank_values((2, 3), np.float64, k, s) for k in range(hvd.size())] for s in (1, 2)]
    first = start(inputs[0][hvd.rank()], f"reuse.{kind}")
    wait_until_finished(first)
    second = start(inputs[1][hvd.rank()], f"reuse.{kind}")  # not synchronized, yet free
    np.testing.assert_array_equal(hvd.synchronize(second), result_of(inputs[1]))
    # Synchronized late, after its name was taken again: still its own result.
    np.testing.assert_array_equal(hvd.synchronize(first), result_of(inputs[0]))


def test_horovod_duplicate_name_tests_one_after_another():
    # Horovod 0.28.1's test_horovod_{allreduce,allgather,broadcast}_duplicate_name_error, in one
    # process: rank 0 submits "duplicate_name" (a second submission raises), a barrier, the
    # other ranks do the same (every rank has submitted it now), a barrier; then the next
    # collective under the same name. Nobody synchronizes: the barrier returns once what every
    # rank submitted before it has finished here, so the name is free for the next. Without
    # overlap a rank's engine gathers its own requests, so nothing completes between the two
    # submissions, however fast the engine.
    eng, me = engine(), hvd.rank()
    before, eng.overlap = eng.overlap, False
    tensor = np.ones((17, 17, 17), np.float32)
    try:
        for kind, (start, _) in STARTS.items():
            for my_turn in (me == 0, me > 0):
                if my_turn:
                    start(tensor, "duplicate_name")
                    with pytest.raises(ValueError, match=f"{kind} 'duplicate_name' is already in"):
                        start(tensor, "duplicate_name")
                hvd.barrier()
    finally:
        eng.overlap = before


def test_a_dropped_handle_holds_neither_its_name_nor_its_result():
    x = rank_values((1000,), np.float64, hvd.rank(), 7)
    handle = hvd.allreduce_async(x, op=hvd.Sum, name="dropped")
    wait_until_finished(handle)
    result, request = weakref.ref(handle.result), weakref.ref(handle)  # (its own handle)
    del handle
    gc.collect()
    assert result() is None and request() is None
    # Dropped before it finished: the engine keeps it until then, and not after.
    request = weakref.ref(hvd.allreduce_async(x, op=hvd.Sum, name="dropped"))
    hvd.barrier()  # every rank submitted it before: it has finished here
    gc.collect()
    assert request() is None
    again = hvd.allreduce_async(x, op=hvd.Sum, name="dropped")
    inputs = [rank_values((1000,), np.float64, k, 7) for k in range(hvd.size())]
    assert_reduced(hvd.synchronize(again), reduce_expected(inputs, hvd.Sum))


# ---------------------------------------------------------------------------------------------
# Join.


@pytest.mark.parametrize("last", ["highest", "lowest"])
def test_join_with_uneven_batches(last, overlap):
    n, me = hvd.size(), hvd.rank()
    batches = [k + 1 if last == "highest" else n - k for k in range(n)]
    shape = (4, 3)
    for step in range(batches[me]):
        active = [k for k in range(n) if step < batches[k]]

        def inputs(dtype, seed, active=active):
            return [rank_values(shape, dtype, k, seed) if k in active
                    else np.zeros(shape, dtype) for k in range(n)]  # fmt: skip

        x = rank_values(shape, np.float32, me, 80 + step)
        y = rank_values(shape, np.int64, me, 90 + step)
        zs = [rank_values((2,), np.float64, me, 95 + step), rank_values((0,), np.float64, me, 0)]
        # The same name every step (served by the cache) and a new name every step.
        handles = [
            hvd.allreduce_async(x, op=hvd.Average, name="join.avg"),
            hvd.allreduce_async_(y, op=hvd.Sum, name=f"join.sum.{step}"),
            hvd.grouped_allreduce_async(zs, op=hvd.Sum, name="join.group"),
        ]
        average, total, group = [hvd.synchronize(h) for h in handles]
        assert_reduced(average, reduce_expected(inputs(np.float32, 80 + step), hvd.Average),
                       hvd.Average)  # fmt: skip
        assert total is y
        assert_reduced(total, reduce_expected(inputs(np.int64, 90 + step), hvd.Sum))
        g = [rank_values((2,), np.float64, k, 95 + step) if k in active else np.zeros(2)
             for k in range(n)]  # fmt: skip
        assert_reduced(group[0], reduce_expected(g, hvd.Sum))
        assert group[1].shape == (0,)
    expected_last = n - 1 if last == "highest" else 0
    assert hvd.join() == expected_last
    still_in_step()


def test_only_allreduce_runs_while_ranks_have_joined():
    n, me = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("needs two ranks")
    if me == 0:
        handle = hvd.broadcast_async(np.ones(2), 0, name="join.bcast")
        with pytest.raises(hvd.HorovodLiteError, match="only allreduce takes part in join"):
            hvd.synchronize(handle)
    assert hvd.join() == 0
    still_in_step()


def test_join_on_every_rank_at_once_returns_the_same_rank():
    result = hvd.join()
    assert 0 <= result < hvd.size()
    assert hvd.allgather_object(result) == [result] * hvd.size()


# ---------------------------------------------------------------------------------------------
# Synchronous calls beside the engine.


def test_sync_calls_interleave_with_async_ones(overlap):
    n, me = hvd.size(), hvd.rank()
    rng = np.random.default_rng([5, me])
    handles, errors = [], []

    def background():
        try:
            for step in range(20):
                for i in rng.permutation(4):
                    x = rank_values((i + 1, 3), np.float64, me, 200 + 4 * step + i)
                    handles.append(
                        (step, i, hvd.allreduce_async(x, op=hvd.Sum, name=f"bg.{step}.{i}"))
                    )
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    thread = threading.Thread(target=background)
    thread.start()
    for step in range(20):
        x = rank_values((6,), np.int32, me, 300 + step)
        out = hvd.allreduce(x, op=hvd.Sum, name=f"fg.{step}")
        inputs = [rank_values((6,), np.int32, k, 300 + step) for k in range(n)]
        assert_reduced(out, reduce_expected(inputs, hvd.Sum))
        assert hvd.allgather_object(step) == [step] * n
        h = hvd.broadcast_async(np.full(2, me), n - 1, name="fg.async")
        np.testing.assert_array_equal(hvd.synchronize(h), [n - 1, n - 1])
    thread.join()
    assert not errors, errors
    for step, i, handle in handles:
        inputs = [rank_values((i + 1, 3), np.float64, k, 200 + 4 * step + i) for k in range(n)]
        assert_reduced(hvd.synchronize(handle), reduce_expected(inputs, hvd.Sum))


def test_without_overlap_requests_nobody_waits_for_still_run():
    # A rank with no spare core gathers its requests while more keep coming; on one host it
    # gathers for longer (wakeup.GATHER_ONE_HOST), but work that nobody waits for still runs
    # once submissions stop. Nothing here asks for the result (done() and synchronize() would
    # end the gathering) until it has finished.
    eng = engine()
    assert eng._gather == GATHER_ONE_HOST  # these jobs run on one host
    before, eng.overlap = eng.overlap, False
    try:
        hvd.barrier()
        x = np.full(3, float(hvd.rank()))
        handle = hvd.allreduce_async(x, op=hvd.Sum, name="unwaited")
        deadline = time.monotonic() + 60  # a guard against a hang only
        while not handle.finished and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handle.finished, "a request nobody waited for never ran"
        n = hvd.size()
        np.testing.assert_array_equal(hvd.synchronize(handle), np.full(3, n * (n - 1) / 2))
    finally:
        eng.overlap = before


# ---------------------------------------------------------------------------------------------
# The idle engine.


def test_the_idle_engine_runs_no_cycle():
    # A fresh engine starts asleep: no cycle at all while nobody submits. Every rank checks
    # before any rank submits (a barrier with nothing in flight does not wake the engines): a
    # rank that submitted while another still slept its second woke that rank's engine, so
    # the check raced the other ranks' next step under load.
    hvd.shutdown()
    hvd.init()
    time.sleep(1.0)
    cycles = engine().cycles
    hvd.barrier()
    assert cycles == 0
    # After work, the cycle that finds every rank idle puts every engine to sleep. When that
    # cycle comes depends on the load; that it comes, and no cycle after it, is the point. The
    # engine counts the sleep before it sleeps (no cycle comes after that), so wait for the
    # count, not for the cycles to look still for a while (a descheduled engine looks still).
    sleeps = engine()._wakeup.sleeps
    hvd.synchronize(hvd.allreduce_async(np.ones(2), name="idle.work"))
    deadline = time.monotonic() + 120  # a guard against a hang only
    while engine()._wakeup.sleeps == sleeps and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine()._wakeup.sleeps == sleeps + 1
    assert engine().cycles > 0
    # The same second on every rank (a barrier with nothing in flight wakes no engine),
    # so no rank's next step lands in another rank's idle second.
    hvd.barrier()
    before = engine().cycles
    time.sleep(1.0)
    after = engine().cycles
    hvd.barrier()
    assert after == before
    # And a submission wakes them all again.
    out = hvd.synchronize(hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="idle.again"))
    np.testing.assert_array_equal(out, np.full(2, float(hvd.size())))
    still_in_step()


# ---------------------------------------------------------------------------------------------
# Repeated requests: their arguments are checked once (plan.templates) and the cache confirms
# them by identity (AgreedCache), yet every call's own array is checked and a change is found.


def test_a_repeated_request_still_checks_the_array_it_is_given():
    n, me, last = hvd.size(), hvd.rank(), hvd.size() - 1
    for _ in range(2):  # the second call finds the first one's template
        x = np.ones(3)
        out = hvd.synchronize(hvd.allreduce_async_(x, op=hvd.Sum, name="template.inplace"))
        assert out is x
        np.testing.assert_array_equal(x, np.full(3, float(n)))
    frozen = np.ones(3)
    frozen.flags.writeable = me != last
    handle = hvd.allreduce_async_(frozen, op=hvd.Sum, name="template.inplace")
    expect_error_everywhere(lambda: hvd.synchronize(handle), {last}, ValueError,
                            f"rank {last} failed before sending", "read-only")  # fmt: skip
    still_in_step()


class _Subclass(np.ndarray):
    pass


def test_a_repeated_async_allreduce_takes_the_short_way_only_where_a_template_covers_it():
    # repeated_allreduce_plan: a call whose arguments, dtype and shape an earlier call had
    # is built from that call's template; every other call goes the general way.
    n, me, world = hvd.size(), hvd.rank(), hvd.global_process_set
    x = rank_values((3, 5), np.float32, me, 0)
    want = reduce_expected([rank_values((3, 5), np.float32, k, 0) for k in range(n)], hvd.Average)

    def short(tensor, prescale=1.0, process_set=world, inplace=False):
        return repeated_allreduce_plan(tensor, None, "repeat.w", prescale, 1.0, process_set,
                                       None, inplace)  # fmt: skip

    assert short(x) is None  # no call yet
    for _ in range(2):
        assert_reduced(hvd.synchronize(hvd.allreduce_async(x, name="repeat.w")), want, hvd.Average)
    (plan, entry), general = short(x), allreduce_plan(x, name="repeat.w")
    assert plan.fields is general.fields and plan.process_set_id == general.process_set_id
    assert entry.key == general.fusion.key and entry.array is x
    assert plan.comm is general.comm and plan.ranks == general.ranks  # (the global set's, kept)
    assert short(x)[0] is plan and plan.fusion is None  # one plan for the calls, no array in it
    assert_reduced(hvd.synchronize(hvd.allreduce_async(x, name="repeat.w")), want, hvd.Average)
    # Not covered: another shape or dtype, a prescale that is no float (it may equal 1.0), an
    # array subclass, in place (its own template), a read-only array in place.
    frozen = x.copy()
    frozen.flags.writeable = False
    for other in (short(x[:2]), short(x.astype(np.float64)), short(x, prescale=1),
                  short(x, prescale=np.float64(1.0)), short(x.view(_Subclass)),
                  short(x.copy(), inplace=True), short(frozen, inplace=True)):  # fmt: skip
        assert other is None
    for odd in (1, np.float64(1.0)):  # the general way, the same result
        out = hvd.synchronize(hvd.allreduce_async(x, name="repeat.w", prescale_factor=odd))
        assert_reduced(out, want, hvd.Average)
    # A process set that is gone is refused on the short way as on the general one.
    ranks = hvd.add_process_set(list(range(n)))
    for _ in range(2):
        hvd.synchronize(hvd.allreduce_async(x, name="repeat.w", process_set=ranks))
    assert short(x, process_set=ranks) is not None
    hvd.remove_process_set(ranks)
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce_async(x, name="repeat.w", process_set=ranks)
    with pytest.raises(ValueError, match="not registered"):  # (another set is looked up anew)
        short(x, process_set=ranks)


def test_fused_results_kept_by_the_caller_are_never_handed_out_again():
    # A batch's out-of-place results are views of one block (result_memory.py): held, it stays
    # theirs; dropped, the next batch reuses it, and its results are right.
    n, me, count, values = hvd.size(), hvd.rank(), 20, 2048  # 160 KiB a batch: a kept block
    inputs = [[rank_values((values,), np.float32, k, step * count + i) for i in range(count)]
              for k in range(n) for step in range(3)]  # fmt: skip

    def step_inputs(rank: int, step: int) -> list:
        return inputs[rank * 3 + step]

    def run(step: int) -> list:
        handles = [hvd.allreduce_async(a, op=hvd.Sum, name=f"kept.{i}")
                   for i, a in enumerate(step_inputs(me, step))]  # fmt: skip
        return [hvd.synchronize(handle) for handle in handles]

    def expected(step: int) -> list:
        return [reduce_expected([step_inputs(k, step)[i] for k in range(n)], hvd.Sum)
                for i in range(count)]  # fmt: skip

    held = run(0)
    block = held[0].__array_interface__["data"][0]
    later = run(1)
    assert later[0].__array_interface__["data"][0] != block  # the held block was not taken
    for got, want in zip(held + later, expected(0) + expected(1)):
        assert_reduced(got, want)
    del held, got
    gc.collect()
    for got, want in zip(run(2), expected(2)):
        assert_reduced(got, want)


@pytest.mark.skipif(WORLD_SIZE < 2, reason="a mismatch needs two ranks")
def test_a_cached_name_sent_with_other_metadata_raises_on_every_rank():
    n, me, last = hvd.size(), hvd.rank(), hvd.size() - 1
    for _ in range(2):  # agreed, then confirmed by the cache
        out = hvd.synchronize(hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="template.shape"))
        np.testing.assert_array_equal(out, np.full(4, float(n)))
    shape = (5,) if me == last else (4,)
    handle = hvd.allreduce_async(np.ones(shape), op=hvd.Sum, name="template.shape")
    expect_error_everywhere(lambda: hvd.synchronize(handle), set(), None, "shape", "(5,)")
    still_in_step()
    out = hvd.synchronize(hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="template.shape"))
    np.testing.assert_array_equal(out, np.full(4, float(n)))


def test_unnamed_requests_of_one_template_get_names_of_their_own():
    n = hvd.size()
    handles = [hvd.allreduce_async(np.full(2, float(i)), op=hvd.Sum) for i in range(3)]
    names = [handle.key[1] for handle in handles]  # (each its own Request)
    assert len(set(names)) == 3 and all(".noname." in name for name in names)
    for i, handle in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(handle), np.full(2, float(n * i)))
    # The fields they share as a template stay unnamed, and so does the plan that repeated
    # calls share (each named request runs on a copy of it).
    assert allreduce_plan(np.zeros(2), op=hvd.Sum).fields["name"] is None
    shared, _ = repeated_allreduce_plan(np.zeros(2), hvd.Sum, None, 1.0, 1.0,
                                        hvd.global_process_set, None, False)  # fmt: skip
    assert shared.fields["name"] is None and all(h.plan is not shared for h in handles[1:])


def test_templates_follow_the_settings(monkeypatch):
    # A test, or a new init(), that replaces the settings gets plans made under the new ones.
    state = hvd.state.current()
    plan = allreduce_plan(np.ones(2), name="template.algorithm")
    assert plan.fields["algorithm"] == state.settings.allreduce_algorithm
    ring = dataclasses.replace(state.settings, allreduce_algorithm="ring")
    monkeypatch.setattr(state, "settings", ring)
    plan = allreduce_plan(np.ones(2), name="template.algorithm")
    assert plan.fields["algorithm"] == "ring"


def test_many_small_requests_from_two_threads():
    # The case: 200 small arrays submitted from two threads, interleaved, then
    # synchronized; names the cache knows from the second step on.
    n, me, count = hvd.size(), hvd.rank(), 200
    arrays = [rank_values((256,), np.float32, me, i) for i in range(count)]
    expected = [reduce_expected([rank_values((256,), np.float32, k, i) for k in range(n)],
                                hvd.Sum) for i in range(count)]  # fmt: skip
    handles = [None] * count

    def submit(first: int):
        for i in range(first, count, 2):
            handles[i] = hvd.allreduce_async(arrays[i], op=hvd.Sum, name=f"many.{i}")

    for _ in range(3):
        threads = [threading.Thread(target=submit, args=(t,)) for t in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for handle, want in zip(handles, expected):
            assert_reduced(hvd.synchronize(handle), want)
    still_in_step()
