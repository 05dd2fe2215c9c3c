"""broadcast, allgather, reducescatter, alltoall, barrier and the object collectives."""

import dataclasses
import os
import tempfile

import numpy as np
import pytest
from oracle import (
    DTYPES,
    OPS,
    WORLD,
    assert_reduced,
    dtype_id,
    everyone,
    expect_error_everywhere,
    rank_values,
    reduce_expected,
    still_in_step,
)

import horovodlite as hvd


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_broadcast_from_every_root(dtype):
    n, r = hvd.size(), hvd.rank()
    for shape in ((5, 3), (), (0, 2)):
        x = rank_values(shape, dtype, r, seed=10)
        for root in range(n):
            expected = WORLD.bcast(x, root=root)
            out = hvd.broadcast(x, root_rank=root, name=f"b{root}")
            assert out.dtype == x.dtype and out.shape == x.shape
            np.testing.assert_array_equal(out, expected)
            inplace = x.copy()
            assert hvd.broadcast_(inplace, root) is inplace
            np.testing.assert_array_equal(inplace, expected)


def test_broadcast_into_non_contiguous_view():
    n, r = hvd.size(), hvd.rank()
    base = np.full((4, 6), float(r))
    root = n - 1
    view = base[::2, 1::2]
    out = hvd.broadcast(view, root)
    np.testing.assert_array_equal(out, np.full((2, 3), float(root)))
    hvd.broadcast_(view, root)
    expected = np.full((4, 6), float(r))
    expected[::2, 1::2] = root
    np.testing.assert_array_equal(base, expected)
    hvd.broadcast_(base.T, 0)
    np.testing.assert_array_equal(base, WORLD.bcast(expected, root=0))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_allgather_with_different_rows_per_rank(dtype):
    n, r = hvd.size(), hvd.rank()
    # Rank r contributes r rows: rank 0 none at all.
    for trailing in ((), (2, 3)):
        x = rank_values((r, *trailing), dtype, r, seed=11)
        out = hvd.allgather(x, name="rows")
        expected = np.concatenate(everyone(x))
        assert out.dtype == x.dtype
        assert out.shape == (n * (n - 1) // 2, *trailing)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("segment_bytes", [4096, 1 << 20])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8, np.bool_], ids=dtype_id)
def test_large_allgathers_go_around_the_ring(dtype, segment_bytes):
    n, r = hvd.size(), hvd.rank()
    state = hvd.state.current()
    saved = state.settings
    state.settings = dataclasses.replace(saved, ring_segment_bytes=segment_bytes)
    try:
        # Rank 1 sends no rows, the others uneven numbers: results above the ring's threshold.
        rows = 0 if r == 1 else 30_011 + 17 * r
        x = rank_values((rows, 3), dtype, r, seed=21)
        out = hvd.allgather(x, name="large.rows")
        assert out.nbytes >= hvd.algorithms.RING_ALLGATHER_BYTES or n == 1
        np.testing.assert_array_equal(out, np.concatenate(everyone(x)))
        result = np.zeros_like(out)
        start = sum(len(p) for p in everyone(x)[:r])
        result[start : start + rows] = x
        hvd.allgather_into(result, rows, name="large.into")
        np.testing.assert_array_equal(result, out)
    finally:
        state.settings = saved


def test_allgather_edge_cases():
    n, r = hvd.size(), hvd.rank()
    empty = hvd.allgather(np.zeros((0, 4), np.float32))
    assert empty.shape == (0, 4) and empty.dtype == np.float32
    strided = (np.arange(20, dtype=np.int64).reshape(4, 5) + 100 * r)[:, ::2]
    out = hvd.allgather(strided)
    np.testing.assert_array_equal(out, np.concatenate(everyone(strided)))
    ones = hvd.allgather(np.array([r], dtype=np.int16))
    np.testing.assert_array_equal(ones, np.arange(n, dtype=np.int16))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_allgather_into_fills_around_each_ranks_rows(dtype):
    n, r = hvd.size(), hvd.rank()
    # Rank k holds k + 1 rows of (2, 3) at its place (rank 0 first): uneven at every size.
    pieces = [rank_values((k + 1, 2, 3), dtype, k, seed=5) for k in range(n)]
    out = np.zeros((n * (n + 1) // 2, 2, 3), dtype=dtype)
    start = r * (r + 1) // 2
    out[start : start + r + 1] = pieces[r]
    result = hvd.allgather_into(out, r + 1, name="into")
    assert result is out  # in place
    np.testing.assert_array_equal(out, np.concatenate(pieces))


def test_allgather_into_with_no_rows_and_its_errors():
    n, r = hvd.size(), hvd.rank()
    out = np.full(n, -1.0)
    out[r] = r
    rows = 1 if r != 0 or n == 1 else 0  # rank 0 holds nothing, so the total falls short
    if n > 1:
        with pytest.raises(ValueError, match=r"the ranks hold \[0, 1"):
            hvd.allgather_into(out, rows, name="into.short")
    still_in_step()
    expect_error_everywhere(
        lambda: hvd.allgather_into(np.zeros(n), n + 1 if r == n - 1 else 1, name="into.bad"),
        {n - 1}, ValueError, "rows must be an int",
    )  # fmt: skip
    still_in_step()
    empty = np.zeros((0, 2))
    assert hvd.allgather_into(empty, 0).shape == (0, 2)


def horovod_rows(rows: int, n: int) -> list:
    """Return each rank's (start, stop) rows of a reducescatter, as Horovod splits them."""
    base, extra = divmod(rows, n)
    sizes = [base + (1 if k < extra else 0) for k in range(n)]
    starts = np.concatenate(([0], np.cumsum(sizes)))
    return [(int(starts[k]), int(starts[k + 1])) for k in range(n)]


@pytest.mark.parametrize("algorithm", ["ring", "mpi", None])
@pytest.mark.parametrize(
    "dtype", [np.float32, np.int32, np.float16, np.bool_, np.uint8], ids=dtype_id
)
def test_reducescatter_every_op(dtype, algorithm):
    n, r = hvd.size(), hvd.rank()
    for rows, trailing in ((2 * n + 1, (3,)), (max(n - 1, 1), ()), (n, (2, 2)), (0, (4,))):
        x = rank_values((rows, *trailing), dtype, r, seed=12)
        inputs = everyone(x)
        lo, hi = horovod_rows(rows, n)[r]
        for op in OPS:
            if dtype == np.bool_ and op == hvd.Average:
                continue
            out = hvd.reducescatter(x, op=op, algorithm=algorithm, name="rs")
            expected = reduce_expected(inputs, op)[lo:hi]
            try:
                assert_reduced(out, expected, op)
            except AssertionError as exc:
                raise AssertionError(f"rows={rows} op={op.name}: {exc}") from None


def test_reducescatter_split_and_scaling():
    n, r = hvd.size(), hvd.rank()
    rows = 3 * n + n // 2
    x = np.tile(np.arange(rows, dtype=np.float64)[:, None], (1, 2)) + r
    out = hvd.reducescatter(x, prescale_factor=2.0, postscale_factor=0.5)  # default op Average
    lo, hi = horovod_rows(rows, n)[r]
    assert out.shape == (hi - lo, 2)
    # Horovod gives the extra rows to the first ranks.
    assert hi - lo == rows // n + (1 if r < rows % n else 0)
    np.testing.assert_allclose(out, x[lo:hi] - r + (n - 1) / 2)
    sizes = WORLD.allgather(out.shape[0])
    assert sum(sizes) == rows and sizes == sorted(sizes, reverse=True)
    with pytest.raises(ValueError, match="no 'naive' algorithm"):
        hvd.reducescatter(x, algorithm="naive")
    with pytest.raises(ValueError, match="0-d"):
        hvd.reducescatter(np.float32(1.0))
    still_in_step()


def test_grouped_allgather_and_reducescatter_agree_once_and_match_the_single_forms():
    # One agreement for the whole group: mixed dtypes, rows that differ per rank (some none),
    # trailing shapes, a process set; the results equal the single collectives'.
    n, r = hvd.size(), hvd.rank()
    xs = [rank_values((r + 1, 3), np.float32, r, seed=20),
          rank_values((r % 2, 2, 2), np.int64, r),
          rank_values((2 * n + 1,), np.float16, r, seed=21),
          np.zeros((0, 5), np.uint8)]  # fmt: skip
    gathered = hvd.grouped_allgather(xs, name="gg")
    for out, x in zip(gathered, xs):
        expected = np.concatenate(everyone(x))
        assert out.dtype == x.dtype
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(out, hvd.allgather(x))
    ys = [x for x in (rank_values((2 * n + 1, 3), np.float64, r, seed=22),
                      rank_values((n - 1 if n > 1 else 1,), np.int32, r, seed=23))]  # fmt: skip
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        scattered = hvd.grouped_reducescatter(ys, op=op, prescale_factor=1.0, name="grs")
        for out, y in zip(scattered, ys):
            lo, hi = horovod_rows(y.shape[0], n)[r]
            assert_reduced(out, reduce_expected(everyone(y), op)[lo:hi], op)
            np.testing.assert_array_equal(out, hvd.reducescatter(y, op=op))
    assert hvd.grouped_allgather([]) == [] and hvd.grouped_reducescatter([]) == []
    if n > 1:
        evens = hvd.ProcessSet(list(range(0, n, 2)))
        hvd.add_process_set(evens)
        try:
            if evens.included():
                (out,) = hvd.grouped_allgather([np.full(r + 1, r)], process_set=evens)
                repeats = [k + 1 for k in evens.ranks]
                np.testing.assert_array_equal(out, np.repeat(evens.ranks, repeats))
        finally:
            hvd.remove_process_set(evens)


def test_grouped_allgather_and_reducescatter_errors_on_every_rank():
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("a mismatch needs two ranks")
    last = n - 1
    trailing = np.ones((2, 4 if r == last else 3), np.float32)
    expect_error_everywhere(lambda: hvd.grouped_allgather([np.ones(2), trailing], name="gbad"),
                            set(), None, f"rank {last}", "(4,)")  # fmt: skip
    members = [np.ones(3)] * (3 if r == last else 2)
    expect_error_everywhere(lambda: hvd.grouped_reducescatter(members, name="rsbad"),
                            set(), None, "grouped_reducescatter")  # fmt: skip
    scalar = [np.ones(4), np.float64(1.0) if r == last else np.ones(2)]
    expect_error_everywhere(lambda: hvd.grouped_reducescatter(scalar), {last}, ValueError)
    still_in_step()


@pytest.mark.parametrize("dtype", [np.float64, np.int8, np.bool_, np.float16], ids=dtype_id)
def test_alltoall_even_split(dtype):
    n, r = hvd.size(), hvd.rank()
    for per_rank, trailing in ((2, ()), (1, (3,)), (0, (2,))):
        x = rank_values((n * per_rank, *trailing), dtype, r, seed=13)
        out = hvd.alltoall(x, name="even")
        sent = [x[k * per_rank : (k + 1) * per_rank] for k in range(n)]
        expected = np.concatenate(WORLD.alltoall(sent))
        assert out.dtype == x.dtype
        np.testing.assert_array_equal(out, expected)


def test_alltoall_without_splits_when_the_ranks_hold_different_rows():
    # Each rank's rows divide by the ranks but differ between them: what arrives from rank s is
    # its rows divided by the ranks, which the agreement brings every rank; async through the
    # engine too.
    n, r = hvd.size(), hvd.rank()
    x = rank_values((n * (r + 1), 2), np.float64, r, seed=15)
    parts = [x[k * (r + 1) : (k + 1) * (r + 1)] for k in range(n)]
    expected = np.concatenate(WORLD.alltoall(parts))
    np.testing.assert_array_equal(hvd.alltoall(x), expected)
    np.testing.assert_array_equal(hvd.synchronize(hvd.alltoall_async(x)), expected)


@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.bool_], ids=dtype_id)
def test_alltoall_with_splits(dtype):
    n, r = hvd.size(), hvd.rank()
    # Some splits are zero: rank r sends (r + k) % 3 rows to rank k.
    splits = [(r + k) % 3 for k in range(n)]
    x = rank_values((sum(splits), 2), dtype, r, seed=14)
    out, received = hvd.alltoall(x, splits=splits)
    bounds = np.concatenate(([0], np.cumsum(splits)))
    sent = [x[bounds[k] : bounds[k + 1]] for k in range(n)]
    expected = np.concatenate(WORLD.alltoall(sent))
    np.testing.assert_array_equal(out, expected)
    assert received.dtype == np.int32
    assert received.tolist() == [(k + r) % 3 for k in range(n)]
    # Splits may come as a numpy array too, and all of them may be zero.
    out, received = hvd.alltoall(np.zeros((0, 2), dtype), splits=np.zeros(n, np.int64))
    assert out.shape == (0, 2) and received.tolist() == [0] * n


def test_barrier_waits_for_every_rank():
    n, r = hvd.size(), hvd.rank()
    directory = WORLD.bcast(tempfile.mkdtemp() if r == 0 else None, root=0)
    try:
        for round_ in range(3):
            open(os.path.join(directory, f"{round_}.{r}"), "w").close()
            hvd.barrier()
            # After the barrier every rank has created its file for this round.
            present = [os.path.exists(os.path.join(directory, f"{round_}.{k}")) for k in range(n)]
            assert all(present), f"round {round_}: missing {present}"
    finally:
        WORLD.Barrier()
        if r == 0:
            for entry in os.listdir(directory):
                os.remove(os.path.join(directory, entry))
            os.rmdir(directory)


def test_broadcast_object_from_every_root():
    n, r = hvd.size(), hvd.rank()
    for root in range(n):
        obj = {"rank": r, "payload": list(range(r)), "array": np.arange(r)}
        out = hvd.broadcast_object(obj, root_rank=root, name="config")
        assert out["rank"] == root and out["payload"] == list(range(root))
        np.testing.assert_array_equal(out["array"], np.arange(root))
    assert hvd.broadcast_object(None) is None
    assert hvd.broadcast_object("from zero" if r == 0 else "not sent") == "from zero"


def test_allgather_object():
    n, r = hvd.size(), hvd.rank()
    assert hvd.allgather_object(r) == list(range(n))
    objects = hvd.allgather_object({"rank": r, "tuple": (r,) * r}, name="objs")
    assert objects == WORLD.allgather({"rank": r, "tuple": (r,) * r})
    assert hvd.allgather_object(None) == [None] * n
