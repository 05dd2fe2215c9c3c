"""The transport seam (horovodlite/transport.py) on host buffers: torch.distributed's Gloo.

Every collective of the core runs with HOROVODLITE_TRANSPORT=gloo's choice and must equal
mpi4py's own result: every dtype moved, the dtypes Gloo reduces, sizes that do not divide by the
rank count, empty buffers, process sets, the engine's fused buffers. A mismatch is still found over
MPI before any data moves. Skipped where torch (and so Gloo) is missing.
"""

import dataclasses
import json

import numpy as np
import pytest
from oracle import OPS, WORLD, assert_reduced, everyone, rank_values, reduce_expected

import horovodlite as hvd
from horovodlite import staging, tensor_kind, transport
from horovodlite.state import current
from horovodlite.tensor_kind import TensorKind

torch = pytest.importorskip("torch")
import horovodlite.torch  # noqa: E402, F401  (registers gloo)

GLOO_REDUCES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"]


@pytest.fixture(autouse=True)
def over_gloo():
    """Run each test with the gloo transport (the settings are read per collective)."""
    state = current()
    saved = state.settings
    state.settings = dataclasses.replace(saved, transport="gloo")
    yield
    state.settings = saved


def moved_by_gloo(comm) -> bool:
    """Return whether the gloo transport has built its group on `comm` (it moved data there).

    On one rank nothing moves, and no group is built.
    """
    gloo = transport.select(current().settings, np)
    return gloo.name == "gloo" and (comm.size == 1 or comm.Get_attr(gloo._keyval) is not None)


def test_choice_follows_the_setting():
    settings = current().settings
    assert transport.select(settings, np).name == "gloo"
    assert transport.select(settings, np, hvd.Sum, np.dtype(np.float32)).name == "gloo"
    # What Gloo cannot reduce stays on MPI: Adasum, bool, 16-bit and wide unsigned integers.
    assert transport.select(settings, np, hvd.Adasum, np.dtype(np.float32)).name == "mpi"
    for dtype in (np.bool_, np.int16, np.uint16, np.uint32, np.uint64):
        assert transport.select(settings, np, hvd.Sum, np.dtype(dtype)).name == "mpi"
    mpi = dataclasses.replace(settings, transport="mpi")
    assert transport.select(mpi, np).name == "mpi"
    assert transport.describe_choice(settings)["host"] == "gloo"


@pytest.mark.parametrize("dtype", GLOO_REDUCES)
def test_allreduce_every_op(dtype):
    n = hvd.size()
    x = rank_values((n + 2, 3), dtype, hvd.rank(), seed=60)
    inputs = everyone(x)
    for op in OPS:
        out = hvd.allreduce(x, op=op, name=f"gloo.{dtype}.{op.name}")
        assert_reduced(out, reduce_expected(inputs, op), op)
        target = x.copy()
        assert hvd.allreduce_(target, op=op, name=f"gloo_.{dtype}.{op.name}") is target
        assert_reduced(target, reduce_expected(inputs, op), op)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert_reduced(out, reduce_expected(inputs, hvd.Sum, 2.0, 0.5))
    assert moved_by_gloo(current().comm)


def test_the_short_and_the_general_way_meet_over_gloo():
    # A small contiguous array takes the short way (small_allreduce.py), a strided one the
    # general way: ranks that differ must still meet in one check and one Gloo all-reduce.
    r = hvd.rank()
    base = rank_values((6, 4), np.float32, r, seed=63)
    x = base if r % 2 == 0 else np.asfortranarray(base)
    expected = reduce_expected(everyone(base), hvd.Average)
    for step in range(3):
        assert_reduced(hvd.allreduce(x, name=f"gloo.ways.{step}"), expected, hvd.Average)
    y = base.copy() if r % 2 == 0 else np.asfortranarray(base)
    assert hvd.allreduce_(y, op=hvd.Sum, name="gloo.ways_") is y
    assert_reduced(y, reduce_expected(everyone(base), hvd.Sum), hvd.Sum)
    assert moved_by_gloo(current().comm)


def test_fallbacks_to_mpi_still_reduce():
    x = rank_values((5,), np.bool_, hvd.rank(), seed=61)
    np.testing.assert_array_equal(
        hvd.allreduce(x, op=hvd.Sum), reduce_expected(everyone(x), hvd.Sum)
    )
    y = rank_values((5,), np.uint16, hvd.rank(), seed=62)
    assert_reduced(hvd.allreduce(y, op=hvd.Max), reduce_expected(everyone(y), hvd.Max))


def test_empty_and_scalar_buffers():
    n = hvd.size()
    assert hvd.allreduce(np.zeros(0, np.float32), op=hvd.Sum).shape == (0,)
    out = hvd.allreduce(np.array(float(hvd.rank()), np.float64), op=hvd.Sum)
    assert out.shape == () and float(out) == n * (n - 1) / 2


def test_data_movement_of_every_dtype():
    n, r = hvd.size(), hvd.rank()
    for dtype in sorted(hvd.buffers.SUPPORTED_DTYPES, key=str):
        x = rank_values((2 * n, 3), dtype, r, seed=63)
        for root in range(n):
            np.testing.assert_array_equal(hvd.broadcast(x, root_rank=root), WORLD.bcast(x, root))
        rows = x[: r + 1]  # uneven: rank r sends r + 1 rows
        np.testing.assert_array_equal(hvd.allgather(rows), np.concatenate(everyone(rows)))
        even = x[:2]
        np.testing.assert_array_equal(hvd.allgather(even), np.concatenate(everyone(even)))
        expected = np.concatenate(WORLD.alltoall([x[2 * k : 2 * k + 2] for k in range(n)]))
        np.testing.assert_array_equal(hvd.alltoall(x), expected)
    splits = [(r + k) % 3 for k in range(n)]
    y = rank_values((sum(splits), 2), np.int32, r, seed=64)
    out, received = hvd.alltoall(y, splits=splits)
    bounds = np.concatenate(([0], np.cumsum(splits)))
    expected = np.concatenate(WORLD.alltoall([y[bounds[k] : bounds[k + 1]] for k in range(n)]))
    np.testing.assert_array_equal(out, expected)
    assert received.tolist() == [(k + r) % 3 for k in range(n)]
    target = np.full(4, r, np.int64)
    hvd.broadcast_(target, root_rank=n - 1)
    np.testing.assert_array_equal(target, np.full(4, n - 1))
    hvd.barrier()


def test_allgather_into_in_place():
    n, r = hvd.size(), hvd.rank()
    counts = [k % 2 + 1 for k in range(n)]
    out = np.zeros((sum(counts), 2), np.float32)
    start = sum(counts[:r])
    out[start : start + counts[r]] = r + 1
    hvd.allgather_into(out, counts[r])
    np.testing.assert_array_equal(out[:, 0], np.repeat(np.arange(1, n + 1), counts))


@pytest.mark.parametrize("rows_per_rank", [2, 1.5])
def test_reducescatter_even_and_uneven(rows_per_rank):
    n, r = hvd.size(), hvd.rank()
    rows = int(rows_per_rank * n) + (1 if rows_per_rank != int(rows_per_rank) else 0)
    x = rank_values((rows, 2), np.float32, r, seed=65)
    base, extra = divmod(rows, n)
    lo = r * base + min(r, extra)
    hi = lo + base + (1 if r < extra else 0)
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        out = hvd.reducescatter(x, op=op)
        assert_reduced(out, reduce_expected(everyone(x), op)[lo:hi], op)


def test_process_set_gets_its_own_group(no_views):
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("a proper subset needs 3 ranks")
    members = list(range(1, n))
    subset = hvd.add_process_set(members)
    try:
        if r in members:
            x = np.full(3, float(r), np.float32)
            out = hvd.allreduce(x, op=hvd.Sum, process_set=subset)
            np.testing.assert_array_equal(out, np.full(3, float(sum(members))))
            rows = np.full((r, 2), r, np.int16)
            gathered = hvd.allgather(rows, process_set=subset)
            assert gathered.shape == (sum(members), 2)
            comm, _ = hvd.process_sets.communicator(subset)
            assert moved_by_gloo(comm)
            # Torch tensors through the engine, as they are, on the set's own engine group.
            xs = [torch.full((k + 1,), float(r)) for k in range(3)]
            handles = [hvd.torch.allreduce_async_(x, op=hvd.Average, name=f"set.{k}",
                                                  process_set=subset)
                       for k, x in enumerate(xs)]  # fmt: skip
            for handle, x in zip(handles, xs):
                assert hvd.torch.synchronize(handle) is x
                np.testing.assert_allclose(x.numpy(), sum(members) / len(members))
            engine_comm = current().process_sets.lookup(subset.process_set_id).engine_comm
            assert moved_by_gloo(engine_comm)
            # The other collectives of torch tensors, as they are, on the set's groups; the
            # root is a global rank, the second of the set.
            t = torch.full((r, 2), float(r))
            out = hvd.torch.broadcast(t[:1], members[1], process_set=subset)
            np.testing.assert_array_equal(out.numpy(), np.full((1, 2), members[1]))
            out = hvd.torch.allgather(t, process_set=subset)
            np.testing.assert_array_equal(out[:, 0].numpy(), np.repeat(members, members))
            out = hvd.torch.synchronize(hvd.torch.reducescatter_async(
                torch.ones(len(members), 2), op=hvd.Sum, process_set=subset))  # fmt: skip
            np.testing.assert_array_equal(out.numpy(), np.full((1, 2), float(len(members))))
    finally:
        hvd.remove_process_set(subset)


def test_engine_fuses_over_gloo():
    n = hvd.size()
    handles = [
        hvd.allreduce_async(np.full(k + 1, float(hvd.rank()), np.float32), op=hvd.Sum, name=f"f{k}")
        for k in range(5)
    ]
    for k, handle in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(handle), np.full(k + 1, n * (n - 1) / 2))
    handle = hvd.broadcast_async(np.arange(4) + hvd.rank(), root_rank=0, name="eb")
    np.testing.assert_array_equal(hvd.synchronize(handle), np.arange(4))


def test_mismatch_is_found_over_mpi_before_data_moves():
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("a mismatch needs two ranks")
    x = np.ones(3 if r else 4, np.float32)
    with pytest.raises(hvd.MismatchError, match="shape"):
        hvd.allreduce(x, name="gloo.mismatch")
    np.testing.assert_array_equal(hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum), [n, n])


def test_timeline_names_the_transport(tmp_path_factory):
    # Rank 0 writes the timeline; the path need only exist there.
    path = str(tmp_path_factory.mktemp("timeline") / "trace.json")
    hvd.start_timeline(path)
    try:
        handle = hvd.allreduce_async(np.ones(8, np.float32), op=hvd.Sum, name="traced")
        hvd.synchronize(handle)
    finally:
        hvd.stop_timeline()
    if hvd.rank() == 0:
        with open(path) as trace:
            phases = {event["name"] for event in json.load(trace)}
        assert "ALLREDUCE_GLOO" in phases, sorted(phases)


# -- torch tensors as they are (small_allreduce.tensor_allreduce) -----------------------------


@pytest.fixture()
def no_views(monkeypatch):
    """Make any numpy view of a torch tensor in the torch binding's all-reduce fail the test."""
    from horovodlite.torch import mpi_ops

    def refuse(tensor):
        raise AssertionError("the tensor was viewed as a core array")

    monkeypatch.setattr(mpi_ops, "TensorView", refuse)


@pytest.mark.parametrize(
    "dtype, op",
    [("float32", hvd.Average), ("float64", hvd.Sum), ("int64", hvd.Sum), ("int32", hvd.Max),
     ("float32", hvd.Min), ("float64", hvd.Product)],
)  # fmt: skip
def test_torch_tensors_travel_as_they_are(no_views, dtype, op):
    # Gloo takes the tensor itself: no view, no copy, the same lines NCCL runs on a GPU.
    r = hvd.rank()
    base = rank_values((3, 5), dtype, r, seed=71)
    expected = reduce_expected(everyone(base), op)
    for _ in range(2):  # the second call takes the kept route
        x = torch.from_numpy(base.copy())
        out = hvd.torch.allreduce(x, op=op, name=f"torch.as_is.{dtype}")
        assert type(out) is torch.Tensor and out.data_ptr() != x.data_ptr()
        assert_reduced(out.numpy(), expected, op)
        np.testing.assert_array_equal(x.numpy(), base)  # the input is untouched
        version = x._version
        assert hvd.torch.allreduce_(x, op=op, name=f"torch.as_is_.{dtype}") is x
        assert x._version > version  # as torch's own in-place ops: autograd sees the change
        assert_reduced(x.numpy(), expected, op)
    assert moved_by_gloo(current().comm)


def test_torch_scalars_and_empty_tensors_travel_as_they_are(no_views):
    n, r = hvd.size(), hvd.rank()
    scalar = torch.tensor(float(r + 1))
    out = hvd.torch.allreduce(scalar, op=hvd.Sum, name="torch.scalar")
    assert out.shape == () and out.item() == n * (n + 1) / 2 and scalar.item() == r + 1
    assert hvd.torch.allreduce_(scalar, op=hvd.Sum, name="torch.scalar_") is scalar
    assert scalar.item() == n * (n + 1) / 2
    empty = torch.ones(0, 3)
    out = hvd.torch.allreduce(empty, name="torch.empty")
    assert type(out) is torch.Tensor and out.shape == (0, 3) and out is not empty
    assert hvd.torch.allreduce_(empty, name="torch.empty_") is empty


def test_torch_tensors_meet_core_arrays_of_other_ranks():
    # Ranks whose tensor is strided, or an integer Average (which truncates), go the way of core
    # arrays; they meet the ranks whose tensors travel as they are in one check and one call.
    r = hvd.rank()
    base = rank_values((4, 6), np.float32, r, seed=72)
    x = torch.from_numpy(base.copy())
    if r % 2:
        x = x.t().contiguous().t()  # the same values, strided
    expected = reduce_expected(everyone(base), hvd.Average)
    assert_reduced(hvd.torch.allreduce(x, name="torch.mixed").numpy(), expected, hvd.Average)
    ints = rank_values((7,), np.int64, r, seed=73)
    out = hvd.torch.allreduce(torch.from_numpy(ints), name="torch.int_average")
    np.testing.assert_array_equal(out.numpy(), reduce_expected(everyone(ints), hvd.Average))


def test_torch_tensor_mismatch_fails_on_every_rank(no_views):
    if hvd.size() < 2:
        pytest.skip("a mismatch needs two ranks")
    r = hvd.rank()
    x = torch.ones(4 if r == 1 else 3)
    with pytest.raises(hvd.HorovodLiteError, match="allreduce 'torch.mismatch': rank") as error:
        hvd.torch.allreduce(x, name="torch.mismatch")
    assert "rank 1 sent" in str(error.value) and "(3,)" in str(error.value)
    assert hvd.torch.allreduce(torch.ones(2), op=hvd.Sum)[0] == hvd.size()  # still in step


def test_torch_tensors_beside_a_joined_rank(no_views, monkeypatch):
    # The short way's check finds the joined rank; the tensors still go as they are (as one the
    # engine moves), where the joined rank's zeros go the general way.
    from horovodlite.torch.tensors import TORCH_TENSORS

    n, me = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("a joined rank beside others needs two ranks")

    def refuse(tensor):
        raise AssertionError("the tensor was viewed as a core array")

    monkeypatch.setattr(TORCH_TENSORS, "to_core", refuse)
    if me == 0:
        last = hvd.join()
    else:
        x = torch.full((5,), float(me))
        out = hvd.torch.allreduce(x, op=hvd.Sum, name="torch.joined")  # rank 0 adds zeros
        np.testing.assert_array_equal(out.numpy(), np.full(5, n * (n - 1) / 2))
        y = torch.full((2,), float(me))
        assert hvd.torch.allreduce_(y, op=hvd.Sum, name="torch.joined_") is y
        np.testing.assert_array_equal(y.numpy(), np.full(2, n * (n - 1) / 2))
        last = hvd.join()
    assert hvd.allgather_object(last) == [last] * n


# -- torch tensors through the engine as they are (fusion.TensorEntry) ------------------------


def calls_of(monkeypatch, owner, name: str) -> list:
    """Record the arguments of every call of `owner.<name>` (which still runs); return the list."""
    calls, original = [], getattr(owner, name)

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


@pytest.fixture()
def joins(monkeypatch) -> list:
    """Record every batch the engine joins into one torch buffer (TensorKind.join's arguments)."""
    from horovodlite.torch.tensors import TORCH_TENSORS

    return calls_of(monkeypatch, TORCH_TENSORS, "join")


# (130, 130): on the host an in-place result of 64 KiB or more takes the factor on its way out.
ASYNC_SHAPES = [(3,), (2, 5), (), (0, 3), (7,), (4, 3), (1,), (130, 130), (5,)]


@pytest.mark.parametrize(
    "dtype, op, prescale, postscale",
    [("float32", hvd.Average, 1.0, 1.0), ("float64", hvd.Sum, 2.0, 0.5),
     ("float32", hvd.Average, 3.0, 0.25), ("int64", hvd.Sum, 1.0, 1.0),
     ("int32", hvd.Max, 1.0, 1.0), ("float64", hvd.Min, 1.0, 1.0)],
)  # fmt: skip
@pytest.mark.parametrize("all_in_place", [False, True], ids=["mixed", "in_place"])
def test_torch_async_tensors_travel_as_they_are(no_views, joins, dtype, op, prescale,
                                                postscale, all_in_place):  # fmt: skip
    # The engine joins a batch of torch tensors into one torch buffer, moves it with one gloo
    # call and hands back torch tensors: no view, the lines NCCL runs on a GPU. Every tensor in
    # place (the buffer is kept for the next batch), or every other one; odd sizes, a scalar
    # and an empty tensor; three times (the kept template, the kept buffer).
    r = hvd.rank()
    for _ in range(3):
        bases = [rank_values(s, dtype, r, seed=300 + i) for i, s in enumerate(ASYNC_SHAPES)]
        xs = [torch.from_numpy(base.copy()) for base in bases]
        versions = [x._version for x in xs]
        options = dict(op=op, prescale_factor=prescale, postscale_factor=postscale)
        handles = [
            (hvd.torch.allreduce_async_ if all_in_place or i % 2 else hvd.torch.allreduce_async)(
                x, name=f"torch.async.{dtype}.{i}", **options)
            for i, x in enumerate(xs)
        ]  # fmt: skip
        for i, (handle, x, base) in enumerate(zip(handles, xs, bases)):
            out = hvd.torch.synchronize(handle)
            assert type(out) is torch.Tensor and tuple(out.shape) == ASYNC_SHAPES[i]
            if all_in_place or i % 2:
                assert out is x and x._version > versions[i]
            else:
                assert out.data_ptr() != x.data_ptr() or out.numel() == 0
                np.testing.assert_array_equal(x.numpy(), base)  # the input is untouched
            expected = reduce_expected(everyone(base), op, prescale, postscale)
            assert_reduced(out.numpy(), expected, op)
            assert all(o.tobytes() == out.numpy().tobytes() for o in everyone(out.numpy()))
    assert max(len(args[0]) for args in joins) > 1  # fused: one buffer for several tensors
    assert moved_by_gloo(current().process_sets.lookup(0).engine_comm)  # (the engine's own)


def _grouped(inplace: bool, blocking: bool):
    """Return torch's grouped all-reduce as a function of (tensors, **options) -> results."""
    if blocking:
        return hvd.torch.grouped_allreduce_ if inplace else hvd.torch.grouped_allreduce
    start = hvd.torch.grouped_allreduce_async_ if inplace else hvd.torch.grouped_allreduce_async
    return lambda xs, **options: hvd.torch.synchronize(start(xs, **options))


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "blocking"])
@pytest.mark.parametrize("inplace", [False, True], ids=["new", "in_place"])
def test_torch_grouped_tensors_travel_as_they_are(no_views, joins, inplace, blocking):
    # A group travels as one batch of torch tensors, named or not, through the engine or at
    # once on the caller's thread.
    r = hvd.rank()
    grouped = _grouped(inplace, blocking)
    for name in ("torch.group", None, "torch.group"):
        bases = [rank_values(s, np.float32, r, seed=340 + i) for i, s in enumerate(ASYNC_SHAPES)]
        xs = [torch.from_numpy(base.copy()) for base in bases]
        versions = [x._version for x in xs]
        outs = grouped(xs, name=name, prescale_factor=2.0)
        assert len(outs) == len(xs)
        for out, x, base, version in zip(outs, xs, bases, versions):
            assert type(out) is torch.Tensor and (out is x) == inplace
            assert (x._version > version) == inplace
            assert_reduced(out.numpy(), reduce_expected(everyone(base), hvd.Average, 2.0),
                           hvd.Average)  # fmt: skip
    assert joins and max(len(args[0]) for args in joins) == len(ASYNC_SHAPES)


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "blocking"])
def test_torch_grouped_with_a_strided_member_goes_as_views(monkeypatch, blocking):
    # A group with a strided member goes as views, all of it, and reduces alike.
    from horovodlite.torch.tensors import TORCH_TENSORS

    def refuse(*args, **kwargs):
        raise AssertionError("a group with a strided member travelled as tensors")

    monkeypatch.setattr(TORCH_TENSORS, "join", refuse)
    r = hvd.rank()
    bases = [rank_values((3, 4), np.float64, r, seed=350 + i) for i in range(3)]
    xs = [torch.from_numpy(base.copy()) for base in bases]
    xs[1] = xs[1].t().contiguous().t()  # the same values, strided
    outs = _grouped(True, blocking)(xs, op=hvd.Sum, name="torch.strided")
    for out, x, base in zip(outs, xs, bases):
        assert out is x
        assert_reduced(x.numpy(), reduce_expected(everyone(base), hvd.Sum), hvd.Sum)


# A channels_last model's gradients: 4-D and 5-D tensors laid out densely in another order.
# (16, 32, 8, 8) float32 is 128 KiB: on the host an in-place result that large takes the factor
# on its way out of the buffer where it lies in order.
DENSE_SHAPES = [(2, 3, 4, 5), (16, 32, 8, 8), (3,), (2, 2, 3, 3, 3), (1, 5, 1, 2)]


def _laid_out(base: np.ndarray, other_order: bool) -> torch.Tensor:
    """Return `base`'s values as a torch tensor, channels_last where `other_order` (4-D, 5-D)."""
    x = torch.from_numpy(base.copy())
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return x.contiguous(memory_format=layout) if other_order and layout else x


@pytest.mark.parametrize("how", ["async_in_place", "async_mixed", "alone", "grouped", "sync"])
def test_torch_channels_last_tensors_travel_as_they_are(monkeypatch, joins, how):
    # The engine copies tensors laid out in another order into its batch in their logical
    # order, and their results back: no view made, and ranks whose layouts differ (every other
    # tensor channels_last, the other way round on the next rank) reduce alike. With a
    # prescale and Average's division; in a batch, in place or every other one, one at a time
    # (each its own batch), as a group at once on the caller's thread, and synchronously (the
    # engine's way at once, every other one in place).
    from horovodlite.torch import mpi_ops

    view = mpi_ops.TensorView

    def no_views(tensor):  # (a contiguous host tensor's view costs nothing: synchronous ones
        # with a factor take it)
        if how != "sync" or not tensor.is_contiguous():
            raise AssertionError("the tensor was viewed as a core array")
        return view(tensor)

    monkeypatch.setattr(mpi_ops, "TensorView", no_views)
    r = hvd.rank()
    options = dict(op=hvd.Average, prescale_factor=2.0)
    for _ in range(2):  # (the kept template and buffer, the second time)
        bases = [rank_values(s, np.float32, r, seed=360 + i) for i, s in enumerate(DENSE_SHAPES)]
        xs = [_laid_out(base, (i + r) % 2 == 0) for i, base in enumerate(bases)]
        layouts = [x.stride() for x in xs]
        inplace = [how not in ("async_mixed", "sync") or i % 2 == 0 for i in range(len(xs))]
        names = [f"torch.dense.{how}.{i}" for i in range(len(xs))]
        if how == "grouped":
            outs = hvd.torch.grouped_allreduce_(xs, name=f"torch.dense.{how}", **options)
        elif how == "sync":
            outs = [(hvd.torch.allreduce_ if flag else hvd.torch.allreduce)(x, name=name, **options)
                    for x, flag, name in zip(xs, inplace, names)]  # fmt: skip
        elif how == "alone":
            outs = [hvd.torch.synchronize(hvd.torch.allreduce_async_(x, name=name, **options))
                    for x, name in zip(xs, names)]  # fmt: skip
        else:
            handles = [
                (hvd.torch.allreduce_async_ if flag else hvd.torch.allreduce_async)(
                    x, name=name, **options)
                for x, flag, name in zip(xs, inplace, names)
            ]  # fmt: skip
            outs = [hvd.torch.synchronize(handle) for handle in handles]
        for out, x, base, flag, layout in zip(outs, xs, bases, inplace, layouts):
            assert (out is x) == flag and x.stride() == layout  # (the layout kept)
            if not flag:
                np.testing.assert_array_equal(x.numpy(), base)  # the input is untouched
            expected = reduce_expected(everyone(base), hvd.Average, 2.0)
            assert_reduced(out.numpy(), expected, hvd.Average)
            assert all(np.array_equal(o, out.numpy()) for o in everyone(out.numpy()))
    assert any(not x.is_contiguous() for args in joins for x in args[0])


@pytest.mark.parametrize(
    "op, prescale, postscale",
    [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 2.0, 0.5), (hvd.Average, 3.0, 1.0)],
)
@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
def test_torch_allreduce_gradient_travels_as_it_is(monkeypatch, op, prescale, postscale,
                                                   grouped):  # fmt: skip
    # A differentiable all-reduce's backward pass (SyncBatchNorm's, say) sums the upstream
    # gradients as torch tensors over Gloo, no view made: each rank's gradient is that sum
    # times the factors (and divided by the size for Average), the gradient of the sum of the
    # ranks' losses.
    from horovodlite.torch import mpi_ops

    def refuse(tensor):
        raise AssertionError("the gradient was viewed as a core array")

    r, n = hvd.rank(), hvd.size()
    shapes = [(3, 4), (5,)] if grouped else [(3, 4)]
    xs = [torch.ones(shape, requires_grad=True) for shape in shapes]
    upstream = [torch.from_numpy(rank_values(s, np.float32, r, seed=380 + i))
                for i, s in enumerate(shapes)]  # fmt: skip
    options = dict(op=op, prescale_factor=prescale, postscale_factor=postscale)
    if grouped:
        ys = hvd.torch.grouped_allreduce(xs, name="torch.grad.group", **options)
    else:
        ys = [hvd.torch.allreduce(xs[0], name="torch.grad", **options)]
    loss = sum((y * u).sum() for y, u in zip(ys, upstream))
    monkeypatch.setattr(mpi_ops, "TensorView", refuse)  # (the forward's factor took a view)
    loss.backward()
    factor = prescale * postscale / (n if op == hvd.Average else 1)
    for i, (x, shape) in enumerate(zip(xs, shapes)):
        summed = sum(rank_values(shape, np.float32, s, seed=380 + i) for s in range(n))
        np.testing.assert_allclose(x.grad.numpy(), factor * summed, rtol=1e-6)


def test_torch_async_tensors_meet_core_arrays_in_one_batch(monkeypatch):
    # A batch that holds torch tensors and numpy arrays of one kind goes the general way, the
    # tensors through their views; ranks whose batches differ so still reduce alike.
    from horovodlite import fusion

    viewed = calls_of(monkeypatch, fusion, "_through_views")
    r = hvd.rank()
    bases = [rank_values(s, np.float32, r, seed=320 + i) for i, s in enumerate(ASYNC_SHAPES)]
    handles = []
    for i, base in enumerate(bases):
        name = f"torch.meet.{i}"
        if (i + r) % 3 == 0:  # a numpy array, on the core's own API
            handles.append(hvd.allreduce_async(base.copy(), name=name, prescale_factor=2.0))
        else:
            x = torch.from_numpy(base.copy())
            handles.append(hvd.torch.allreduce_async_(x, name=name, prescale_factor=2.0))
    for i, (handle, base) in enumerate(zip(handles, bases)):
        out = hvd.synchronize(handle)  # (the core's synchronize takes the torch handle's core)
        if (i + r) % 3 != 0:
            assert type(out) is torch.Tensor
            out = out.numpy()
        assert_reduced(out, reduce_expected(everyone(base), hvd.Average, 2.0), hvd.Average)
    assert viewed  # (the engine batches what is submitted at once: these mixed batches)


def test_torch_async_tensor_mismatch_fails_on_every_rank(no_views):
    if hvd.size() < 2:
        pytest.skip("a mismatch needs two ranks")
    r = hvd.rank()
    handle = hvd.torch.allreduce_async(torch.ones(4 if r == 1 else 3), name="torch.async.bad")
    with pytest.raises(hvd.HorovodLiteError, match="allreduce 'torch.async.bad'"):
        hvd.torch.synchronize(handle)
    handle = hvd.torch.allreduce_async_(torch.ones(2), op=hvd.Sum, name="torch.async.after")
    assert hvd.torch.synchronize(handle)[0] == hvd.size()  # still in step


def test_torch_async_tensors_beside_a_joined_rank(no_views):
    n, me = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("a joined rank beside others needs two ranks")
    if me == 0:
        last = hvd.join()  # its zeros go the general way, the others' tensors as they are
    else:
        xs = [torch.full((k + 2,), float(me)) for k in range(3)]
        handles = [hvd.torch.allreduce_async_(x, op=hvd.Sum, name=f"torch.async.joined.{k}")
                   for k, x in enumerate(xs)]  # fmt: skip
        for handle, x in zip(handles, xs):
            assert hvd.torch.synchronize(handle) is x
            np.testing.assert_array_equal(x.numpy(), np.full(x.numel(), n * (n - 1) / 2))
        last = hvd.join()
    assert hvd.allgather_object(last) == [last] * n


# (200, 200): 78 KiB, in place on the host it takes the factor on its way out of the buffer.
HALF_SHAPES = [(3,), (2, 5), (), (200, 200), (0, 2), (7,)]


def half_values(shape, dtype: str, seed: int):
    """Return this rank's random values of half type `dtype` as (numpy array, torch tensor)."""
    from horovodlite.torch.tensors import TORCH_TENSORS

    rng = np.random.default_rng([seed, hvd.rank()])
    floats = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    tensor = floats.to(getattr(torch, dtype))
    dtype = TORCH_TENSORS.describe(tensor)[0]  # (bfloat16: ml_dtypes')
    return tensor.view(torch.int16).numpy().view(dtype).copy(), tensor


def same_bits(tensor, array) -> bool:
    return tensor.view(torch.int16).numpy().tobytes() == array.view(np.int16).tobytes()


def assert_same_everywhere(tensor, reference):
    """Assert that every rank got the same bits, close to `reference` (the general way's result
    of the same values, which may have summed in another order: gloo's ring order depends on
    where an element lies in the buffer)."""
    bits = tensor.view(torch.int16).numpy().tobytes()
    assert all(other == bits for other in everyone(bits)), "the ranks' results differ"
    np.testing.assert_allclose(tensor.float().numpy(), reference.astype(np.float32),
                               rtol=2e-2, atol=2e-2)  # fmt: skip


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_half_types_travel_as_they_are_with_a_factor(no_views, joins, dtype):
    # Average divides, and Compression.fp16 makes half-type gradients: they still travel as
    # they are, and round as the general way rounds the same values (numpy arrays on the core's
    # API, over the same gloo): bit for bit where the layout is the same (a single tensor, a
    # group), sync, async (single and fused) and grouped.
    values = [half_values(s, dtype, 360 + i) for i, s in enumerate(HALF_SHAPES)]
    scaled = dict(prescale_factor=1.5, postscale_factor=0.7)  # (and 1/n: Average)
    for i, (array, tensor) in enumerate(values):
        reference = hvd.allreduce(array, name=f"half.ref.{dtype}.{i}")
        out = hvd.torch.allreduce(tensor, name=f"half.sync.{dtype}.{i}")
        assert same_bits(out, reference), i
    arrays, tensors = [a for a, _ in values], [t for _, t in values]
    references = hvd.grouped_allreduce(arrays, name=f"half.ref_group.{dtype}", **scaled)
    outs = hvd.torch.grouped_allreduce(tensors, name=f"half.group.{dtype}", **scaled)
    assert all(same_bits(out, reference) for out, reference in zip(outs, references))
    for start in (hvd.torch.allreduce_async_, hvd.torch.allreduce_async):
        handles = [start(t.clone(), name=f"half.async.{dtype}.{i}", **scaled)
                   for i, t in enumerate(tensors)]  # fmt: skip
        for handle, reference in zip(handles, references):
            assert_same_everywhere(hvd.torch.synchronize(handle), reference)
    assert max(len(args[0]) for args in joins) > 1  # fused: one buffer for several tensors


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_half_types_meet_views_of_other_ranks_bit_for_bit(dtype):
    # A rank whose batch holds a strided member reduces it through views, scaling with numpy;
    # the others' tensors travel as they are, scaled by torch: every rank gets the same bits.
    r = hvd.rank()
    values = [half_values(s, dtype, 380 + i) for i, s in enumerate(HALF_SHAPES)]
    scaled = dict(postscale_factor=0.7)  # (times 1/n: no power of two)
    references = hvd.grouped_allreduce([a for a, _ in values], name=f"half.meet_ref.{dtype}",
                                       **scaled)  # fmt: skip
    for group in (False, True):
        tensors = [t.clone() for _, t in values]
        if r % 2:
            tensors[1] = tensors[1].t().contiguous().t()  # the same values, strided
        if group:
            outs = hvd.torch.grouped_allreduce_(tensors, name=f"half.meet_group.{dtype}", **scaled)
            assert all(same_bits(o.contiguous(), ref) for o, ref in zip(outs, references))
            continue
        handles = [hvd.torch.allreduce_async_(t, name=f"half.meet.{dtype}.{i}", **scaled)
                   for i, t in enumerate(tensors)]  # fmt: skip
        for handle, reference in zip(handles, references):
            assert_same_everywhere(hvd.torch.synchronize(handle).contiguous(), reference)


def test_kept_routes_follow_the_settings():
    # The short ways keep each call's route; settings that choose another transport (a new
    # Settings object, as the tests' fixtures and a re-init make) must not reuse them.
    from horovodlite import small_allreduce
    from horovodlite.plan import templates

    def kept(name):
        memo = templates(current().settings)
        return [route[2] for key, route in memo.items()
                if key[:2] == (small_allreduce._SHORT, name)]  # fmt: skip

    x = np.ones(8, np.float32)
    hvd.allreduce(x, name="routes.follow")
    assert [t.name for t in kept("routes.follow")] == ["gloo"]
    state = current()
    saved = state.settings
    state.settings = dataclasses.replace(saved, transport="mpi")
    try:
        assert hvd.allreduce(x, op=hvd.Sum, name="routes.follow")[0] == hvd.size()
        assert kept("routes.follow") == [None]  # MPI's own all-reduce: no transport object
    finally:
        state.settings = saved


# -- GPU data that no CuPy array holds (bfloat16, or CuPy missing), on the host ---------------
# A torch CUDA tensor whose view would be staged through host memory goes as it is on torch's
# NCCL, agreed on as GPU data, and a joined rank contributes zeros of the kind the binding lent
# (tensor_kind.use_device_tensors). No GPU here: a stand-in kind keeps numpy data that it calls
# GPU data, and its transport is the one select() gives GPU data without NCCL (MPI), so these
# lines run as they run on a GPU, with only the kind's calls differing. The fixture makes the
# core find no CuPy array that holds the data (as where CuPy is missing: buffers.cupy_holds).


class StandIn:
    """A "GPU tensor" of the stand-in kind: numpy data that is not a numpy array."""

    device = "stand-in gpu"

    def __init__(self, array):
        self.a = array
        self.dtype, self.shape, self.nbytes = array.dtype, array.shape, array.nbytes

    def __setitem__(self, index, other) -> None:
        self.a[index] = other.a


class StandInKind(TensorKind):
    """The stand-in kind: its tensors lie "on a GPU" and MPI moves them as they are."""

    def __init__(self):
        self.zeros_made = 0

    def describe(self, tensor):
        return tensor.dtype, tensor.shape, False

    def contiguous(self, tensor) -> bool:
        return True

    def carried_by(self, chosen) -> bool:
        return chosen.name == "mpi"

    def empty_like(self, tensor):
        return StandIn(np.empty_like(tensor.a))

    def flat(self, tensor):
        return StandIn(tensor.a.reshape(-1))

    def scale(self, tensor, factor: float) -> None:
        staging.scale(np, tensor.a, factor)

    def scales_alike(self, dtype) -> bool:
        return dtype.kind == "f"

    def allreduce(self, chosen, comm, out, source, op) -> None:
        buf = out.a.reshape(-1)
        algorithm = chosen.allreduce_algorithm(None, buf.nbytes, buf.dtype, np, comm)
        source = None if source is None else source.a.reshape(-1)
        chosen.allreduce(comm, buf, op, np, algorithm, None, source)

    def join(self, tensors, prescale: float, reused: bool) -> tuple:
        parts = [StandIn(t.a.reshape(-1)) for t in tensors]
        buffer = StandIn(np.concatenate([p.a for p in parts]))
        self.scale(buffer, prescale)
        return buffer, parts

    def split(self, buffer, parts, tensors, inplace, factor: float) -> list:
        self.scale(buffer, factor)
        results, start = [], 0
        for part, tensor, flag in zip(parts, tensors, inplace):
            piece = buffer.a[start : start + part.a.size]
            start += part.a.size
            if flag:
                part.a[...] = piece
            results.append(tensor if flag else StandIn(piece.reshape(tensor.shape)))
        return results

    def zeros(self, dtype, shape: tuple):
        self.zeros_made += 1
        return StandIn(np.zeros(shape, dtype))

    def to_core(self, tensor):
        return tensor.a.copy()  # (as a staged view: a host copy)

    def from_core(self, array, tensor, inplace: bool):
        raise AssertionError("GPU data that no CuPy array holds went the general way")


@pytest.fixture()
def stand_in(monkeypatch):
    """Lend the stand-in kind for GPU data that no CuPy array holds; return it."""
    from horovodlite import fusion

    monkeypatch.setattr(fusion, "cupy_holds", lambda dtype: False)
    kind, lent = StandInKind(), tensor_kind.device_tensors()
    tensor_kind.use_device_tensors(kind)
    yield kind
    tensor_kind.use_device_tensors(lent)


def test_gpu_data_no_cupy_holds_goes_as_it_is(stand_in, monkeypatch):
    # Agreed on as GPU data, fused into one buffer of the kind's, moved, split back: async in
    # place and not, sync, with a factor and without.
    from horovodlite.asynchronous import tensor_allreduce_async
    from horovodlite.small_allreduce import tensor_allreduce
    from horovodlite.tensor_plans import tensor_allreduce_now, tensor_allreduce_plan

    joined = calls_of(monkeypatch, stand_in, "join")
    r = hvd.rank()
    one = StandIn(np.ones(3, np.float32))
    assert tensor_allreduce_plan(one, stand_in, "nocupy.plan", False, {}).fields["device"] == "cuda"
    for _ in range(2):
        bases = [rank_values(s, np.float32, r, seed=400 + i) for i, s in enumerate(ASYNC_SHAPES)]
        xs = [StandIn(base.copy()) for base in bases]
        options = dict(op=hvd.Average, prescale_factor=2.0)
        handles = [tensor_allreduce_async(x, stand_in, f"nocupy.{i}", i % 2 == 1, options)
                   for i, x in enumerate(xs)]  # fmt: skip
        for i, (handle, x, base) in enumerate(zip(handles, xs, bases)):
            out = hvd.synchronize(handle)
            assert type(out) is StandIn and (out is x) == (i % 2 == 1)
            expected = reduce_expected(everyone(base), hvd.Average, 2.0)
            assert_reduced(out.a, expected, hvd.Average)
        x = StandIn(bases[1].copy())
        assert tensor_allreduce(x, stand_in, "nocupy.sync", True, {"op": hvd.Sum}) is x
        assert_reduced(x.a, reduce_expected(everyone(bases[1]), hvd.Sum), hvd.Sum)
        # A factor: not the short way's, the engine's tensor way at once (tensor_allreduce_now)
        scaled = dict(prescale_factor=2.0, postscale_factor=0.5, process_set=hvd.global_process_set)
        for inplace in (False, True):
            x = StandIn(bases[2].copy())
            out = tensor_allreduce_now(x, stand_in, f"nocupy.now.{inplace}", inplace, scaled)
            assert type(out) is StandIn and (out is x) == inplace
            expected = reduce_expected(everyone(bases[2]), hvd.Average, 2.0, 0.5)
            assert_reduced(out.a, expected, hvd.Average)
    assert joined and stand_in.zeros_made == 0


def test_gpu_data_no_cupy_holds_beside_a_joined_rank(stand_in):
    # The joined rank's zeros are the lent kind's, moved as the others' tensors are: sync (the
    # short way's check finds the joined rank), at once with a factor, and async.
    from horovodlite.asynchronous import tensor_allreduce_async
    from horovodlite.small_allreduce import tensor_allreduce
    from horovodlite.tensor_plans import tensor_allreduce_now

    n, me = hvd.size(), hvd.rank()
    if n < 2:
        pytest.skip("a joined rank beside others needs two ranks")
    if me == 0:
        last = hvd.join()
        assert stand_in.zeros_made == 5
    else:
        total = n * (n - 1) / 2
        x = StandIn(np.full((5,), float(me), np.float32))
        out = tensor_allreduce(x, stand_in, "nocupy.joined", False, {"op": hvd.Sum})
        assert type(out) is StandIn and out is not x
        np.testing.assert_array_equal(out.a, np.full(5, total))
        assert tensor_allreduce(x, stand_in, "nocupy.joined_", True, {"op": hvd.Sum}) is x
        np.testing.assert_array_equal(x.a, np.full(5, total))
        y = StandIn(np.full((3,), float(me), np.float32))
        out = tensor_allreduce_now(y, stand_in, "nocupy.joined.now", False,
                                   {"op": hvd.Sum, "postscale_factor": 2.0})  # fmt: skip
        np.testing.assert_array_equal(out.a, np.full(3, 2 * total))
        xs = [StandIn(np.full((k + 2,), float(me), np.float32)) for k in range(2)]
        handles = [tensor_allreduce_async(x, stand_in, f"nocupy.async.joined.{k}", True,
                                          {"op": hvd.Sum}) for k, x in enumerate(xs)]  # fmt: skip
        for handle, x in zip(handles, xs):
            assert hvd.synchronize(handle) is x
            np.testing.assert_array_equal(x.a, np.full(x.a.size, total))
        last = hvd.join()
        assert stand_in.zeros_made == 0
    assert hvd.allgather_object(last) == [last] * n


def test_gpu_data_no_cupy_holds_beside_host_data_fails_on_every_rank(stand_in):
    # A rank whose data goes as host data (a staged view: a strided tensor, say) where another's
    # travels as GPU data: every rank fails, naming the device, and stays in step.
    from horovodlite.asynchronous import tensor_allreduce_async

    if hvd.size() < 2:
        pytest.skip("a mismatch needs two ranks")
    r = hvd.rank()
    for blocking in (False, True):
        name = f"nocupy.device.{blocking}"
        with pytest.raises(hvd.HorovodLiteError, match=f"allreduce '{name}'") as error:
            if r == 1 and blocking:
                hvd.allreduce(np.ones(3, np.float32), name=name)  # host data
            elif r == 1:
                hvd.synchronize(hvd.allreduce_async(np.ones(3, np.float32), name=name))
            elif blocking:
                hvd.small_allreduce.tensor_allreduce(
                    StandIn(np.ones(3, np.float32)), stand_in, name, False, {})  # fmt: skip
            else:
                hvd.synchronize(tensor_allreduce_async(StandIn(np.ones(3, np.float32)), stand_in,
                                                       name, False, {}))  # fmt: skip
        assert "device" in str(error.value) and "cuda" in str(error.value), str(error.value)
    assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="nocupy.after")[0] == hvd.size()


# -- broadcast, all-gather and reduce-scatter of torch tensors as they are (tensor_plans.py) ---

MOVED_DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                "float32", "float64"]  # fmt: skip


def as_torch(array: np.ndarray) -> torch.Tensor:
    from horovodlite.torch.tensors import _from_numpy

    return _from_numpy(np.ascontiguousarray(array)).clone()


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    from horovodlite.torch.tensors import _numpy_view

    return _numpy_view(tensor.contiguous())


def strided(tensor: torch.Tensor) -> torch.Tensor:
    """The same values, laid out in another order (not contiguous) where it has two dimensions."""
    return tensor.t().contiguous().t() if tensor.dim() == 2 else tensor


@pytest.fixture()
def moved_as_they_are(monkeypatch) -> list:
    """Record each plan the torch binding takes as it is, where no view may be made."""
    from horovodlite.torch import mpi_ops

    def refuse(tensor):
        raise AssertionError("the tensor was viewed as a core array")

    monkeypatch.setattr(mpi_ops, "TensorView", refuse)
    plans = []
    for name in ("tensor_broadcast_plan", "tensor_allgather_plan", "tensor_alltoall_plan",
                 "tensor_reducescatter_plan"):  # fmt: skip
        original = getattr(mpi_ops, name)

        def spy(*args, _original=original, **kwargs):
            plan = _original(*args, **kwargs)
            plans.append(plan)
            return plan

        monkeypatch.setattr(mpi_ops, name, spy)
    return plans


@pytest.mark.parametrize("dtype", MOVED_DTYPES)
def test_torch_broadcast_travels_as_it_is(moved_as_they_are, dtype):
    n, r = hvd.size(), hvd.rank()
    base = rank_values((3, 4), dtype, r, seed=81)
    for root in range(n):
        expected = WORLD.bcast(base, root)
        for layout in (lambda t: t, strided):
            x = layout(as_torch(base))
            out = hvd.torch.broadcast(x, root, name=f"bcast.{dtype}.{root}")
            assert out.data_ptr() != x.data_ptr() and out.dtype == x.dtype
            np.testing.assert_array_equal(as_numpy(out), expected)
            np.testing.assert_array_equal(as_numpy(x), base)  # the input is untouched
            out = hvd.torch.synchronize(hvd.torch.broadcast_async(x, root))
            np.testing.assert_array_equal(as_numpy(out), expected)
            version = x._version
            assert hvd.torch.broadcast_(x, root, name=f"bcast_.{dtype}.{root}") is x
            assert x._version > version  # autograd sees the change
            np.testing.assert_array_equal(as_numpy(x), expected)
            y = layout(as_torch(base))
            assert hvd.torch.synchronize(hvd.torch.broadcast_async_(y, root)) is y
            np.testing.assert_array_equal(as_numpy(y), expected)
    assert moved_as_they_are and None not in moved_as_they_are
    assert moved_by_gloo(current().comm)


@pytest.mark.parametrize("dtype", MOVED_DTYPES)
def test_torch_allgather_travels_as_it_is(moved_as_they_are, dtype):
    n, r = hvd.size(), hvd.rank()
    x = rank_values((2 * n, 3), dtype, r, seed=82)
    # Uneven (rank r sends r + 1 rows; the last rank none where there are several), even, and
    # strided: each rank's rows in rank order.
    rows = 0 if r == n - 1 and n > 1 else r + 1
    for part in (x[:rows], x[:2], x[:2].T.copy().T):
        for layout in (lambda t: t, strided):
            tensor = layout(as_torch(part))
            expected = np.concatenate(everyone(part))
            out = hvd.torch.allgather(tensor, name=f"gather.{dtype}")
            np.testing.assert_array_equal(as_numpy(out), expected)
            out = hvd.torch.synchronize(hvd.torch.allgather_async(tensor))
            np.testing.assert_array_equal(as_numpy(out), expected)
    assert moved_as_they_are and None not in moved_as_they_are


@pytest.mark.parametrize("dtype", MOVED_DTYPES)
def test_torch_alltoall_travels_as_it_is(moved_as_they_are, dtype):
    n, r = hvd.size(), hvd.rank()
    x = rank_values((2 * n, 3), dtype, r, seed=86)
    even = np.concatenate(WORLD.alltoall([x[2 * k : 2 * k + 2] for k in range(n)]))
    splits = [(r + k) % 3 for k in range(n)]  # (some ranks send some others nothing)
    y = rank_values((sum(splits), 3), dtype, r, seed=87)
    bounds = np.concatenate(([0], np.cumsum(splits)))
    uneven = np.concatenate(WORLD.alltoall([y[bounds[k] : bounds[k + 1]] for k in range(n)]))
    z = rank_values((n * (r + 1), 3), dtype, r, seed=88)  # no splits, rows differ by rank
    parts = [z[k * (r + 1) : (k + 1) * (r + 1)] for k in range(n)]
    differing = np.concatenate(WORLD.alltoall(parts))
    for layout in (lambda t: t, strided):
        out = hvd.torch.alltoall(layout(as_torch(x)), name=f"a2a.{dtype}")
        np.testing.assert_array_equal(as_numpy(out), even)
        out = hvd.torch.synchronize(hvd.torch.alltoall_async(layout(as_torch(x))))
        np.testing.assert_array_equal(as_numpy(out), even)
        out = hvd.torch.alltoall(layout(as_torch(z)))
        np.testing.assert_array_equal(as_numpy(out), differing)
        out = hvd.torch.synchronize(hvd.torch.alltoall_async(layout(as_torch(z))))
        np.testing.assert_array_equal(as_numpy(out), differing)
        for given in (splits, torch.tensor(splits)):
            out, received = hvd.torch.alltoall(layout(as_torch(y)), splits=given)
            np.testing.assert_array_equal(as_numpy(out), uneven)
            assert received.tolist() == [(k + r) % 3 for k in range(n)]
        handle = hvd.torch.alltoall_async(layout(as_torch(y)), splits=splits)
        out, received = hvd.torch.synchronize(handle)
        np.testing.assert_array_equal(as_numpy(out), uneven)
        assert type(received) is torch.Tensor and received.tolist() == [
            (k + r) % 3 for k in range(n)
        ]
    assert moved_as_they_are and None not in moved_as_they_are


@pytest.mark.parametrize(
    "dtype, op, prescale, postscale",
    [("float32", hvd.Average, 1.0, 1.0), ("float64", hvd.Sum, 0.5, 4.0),
     ("float32", hvd.Average, 2.0, 0.25), ("int32", hvd.Sum, 1.0, 1.0),
     ("int64", hvd.Max, 1.0, 1.0), ("bfloat16", hvd.Min, 1.0, 1.0),
     ("float16", hvd.Sum, 1.0, 1.0), ("float64", hvd.Product, 1.0, 1.0)],
)  # fmt: skip
@pytest.mark.parametrize("rows_per_rank", [2, 1.5])
def test_torch_reducescatter_travels_as_it_is(moved_as_they_are, dtype, op, prescale, postscale,
                                              rows_per_rank):  # fmt: skip
    n, r = hvd.size(), hvd.rank()
    rows = int(rows_per_rank * n) + (rows_per_rank != int(rows_per_rank))
    x = rank_values((rows, 2), dtype, r, seed=83)
    base, extra = divmod(rows, n)
    lo = r * base + min(r, extra)
    hi = lo + base + (r < extra)
    expected = reduce_expected(everyone(x), op, prescale, postscale)[lo:hi]
    args = dict(op=op, prescale_factor=prescale, postscale_factor=postscale)
    for tensor in (as_torch(x), strided(as_torch(x))):
        out = hvd.torch.reducescatter(tensor, name=f"rs.{dtype}", **args)
        assert_reduced(as_numpy(out), expected, op)
        np.testing.assert_array_equal(as_numpy(tensor), x)  # the input is untouched
        out = hvd.torch.synchronize(hvd.torch.reducescatter_async(tensor, **args))
        assert_reduced(as_numpy(out), expected, op)
    assert moved_as_they_are and None not in moved_as_they_are
    assert moved_by_gloo(current().comm)


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "blocking"])
def test_torch_grouped_movement_travels_as_it_is(moved_as_they_are, blocking):
    # (the fixture refuses any view: the group went as it is, or the test fails)
    n, r = hvd.size(), hvd.rank()
    parts = [rank_values((r + 1, 2), np.float32, r, seed=88),
             rank_values((2, 3), np.int64, r, seed=89),
             rank_values((0 if r else 1, 4), "bfloat16", r, seed=90)]  # fmt: skip
    tensors = [as_torch(parts[0]), strided(as_torch(parts[1])), as_torch(parts[2])]
    if blocking:
        out = hvd.torch.grouped_allgather(tensors, name="ggather")
    else:
        out = hvd.torch.synchronize(hvd.torch.grouped_allgather_async(tensors))
    for got, part in zip(out, parts):
        np.testing.assert_array_equal(as_numpy(got), np.concatenate(everyone(part)))
    rows = [2 * n + 1, n]
    xs = [rank_values((k, 2), dtype, r, seed=91) for k, dtype in zip(rows, ("float32", "float64"))]
    args = dict(op=hvd.Average, prescale_factor=2.0)
    tensors = [as_torch(xs[0]), strided(as_torch(xs[1]))]
    if blocking:
        out = hvd.torch.grouped_reducescatter(tensors, name="gscatter", **args)
    else:
        out = hvd.torch.synchronize(hvd.torch.grouped_reducescatter_async(tensors, **args))
    for got, x, count in zip(out, xs, rows):
        base, extra = divmod(count, n)
        lo = r * base + min(r, extra)
        expected = reduce_expected(everyone(x), hvd.Average, 2.0)[lo : lo + base + (r < extra)]
        assert_reduced(as_numpy(got), expected, hvd.Average)


def test_torch_movement_meets_core_arrays_of_other_ranks(monkeypatch):
    # Every other rank hands numpy arrays to the core: its general plans move them on the same
    # Gloo group, with the same calls, and the ranks meet (uneven parts pad alike).
    n, r = hvd.size(), hvd.rank()
    from horovodlite.torch import mpi_ops

    made = calls_of(monkeypatch, mpi_ops, "tensor_reducescatter_plan")
    own = r % 2 == 0

    def run(torch_call, core_call, array, *args, **kwargs):
        if own:
            return as_numpy(torch_call(as_torch(array), *args, **kwargs))
        return core_call(array, *args, **kwargs)

    x = rank_values((2 * n + 1, 3), np.float32, r, seed=84)
    for root in range(n):
        np.testing.assert_array_equal(
            run(hvd.torch.broadcast, hvd.broadcast, x, root), WORLD.bcast(x, root)
        )
    for part in (x[: r + 1], x[:2]):
        np.testing.assert_array_equal(
            run(hvd.torch.allgather, hvd.allgather, part), np.concatenate(everyone(part))
        )
    base, extra = divmod(2 * n + 1, n)
    lo = r * base + min(r, extra)
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        out = run(hvd.torch.reducescatter, hvd.reducescatter, x, op=op)
        assert_reduced(out, reduce_expected(everyone(x), op)[lo : lo + out.shape[0]], op)
    splits = [(r + k) % 3 for k in range(n)]
    y = x[: sum(splits)]
    bounds = np.concatenate(([0], np.cumsum(splits)))
    if own:
        out = as_numpy(hvd.torch.alltoall(as_torch(y), splits=splits)[0])
    else:
        out, _ = hvd.alltoall(y, splits=splits)
    expected = np.concatenate(WORLD.alltoall([y[bounds[k] : bounds[k + 1]] for k in range(n)]))
    np.testing.assert_array_equal(out, expected)
    even = x[: 2 * n]
    out = run(hvd.torch.reducescatter, hvd.reducescatter, even, op=hvd.Sum)
    assert_reduced(out, reduce_expected(everyone(even), hvd.Sum)[2 * r : 2 * r + 2], hvd.Sum)
    assert len(made) == (4 if own else 0)


def test_torch_integer_average_reducescatter_goes_as_views(monkeypatch):
    # An integer Average truncates through float64 (staging.scale): torch's multiply would not,
    # so the tensor goes as a view, on every rank alike (the dtype and the rank count are
    # agreed).
    from horovodlite.torch import mpi_ops

    viewed = calls_of(monkeypatch, mpi_ops, "TensorView")
    n, r = hvd.size(), hvd.rank()
    x = rank_values((n, 2), np.int64, r, seed=85)
    out = hvd.torch.reducescatter(as_torch(x), op=hvd.Average)
    expected = reduce_expected(everyone(x), hvd.Average)[r : r + 1]
    np.testing.assert_array_equal(out.numpy(), expected)
    assert bool(viewed) == (n > 1)  # (on one rank Average divides by 1: no scaling)


def test_torch_movement_mistakes_fail_on_every_rank(moved_as_they_are):
    if hvd.size() < 2:
        pytest.skip("a mismatch needs two ranks")
    n, r = hvd.size(), hvd.rank()
    x = torch.ones(2, 4 if r == 1 else 3)
    with pytest.raises(hvd.HorovodLiteError, match="allgather 'gather.mismatch'") as error:
        hvd.torch.allgather(x, name="gather.mismatch")
    assert "rank 1 sent" in str(error.value)
    # A root that is no rank, on one rank only: that rank's view reports it, the others' tensors
    # meet it in the check (it goes as a view there, made of the patched TensorView: allowed).
    from horovodlite.torch import mpi_ops

    monkeypatch = pytest.MonkeyPatch()
    try:
        monkeypatch.setattr(mpi_ops, "TensorView", hvd.torch.tensors.TensorView)
        root = n + 5 if r == 1 else 0
        expected = ValueError if r == 1 else hvd.HorovodLiteError
        with pytest.raises(expected, match="root_rank|rank 1"):
            hvd.torch.broadcast(torch.ones(3), root, name="bcast.bad_root")
    finally:
        monkeypatch.undo()
    out = hvd.torch.reducescatter(torch.ones(n, 2), op=hvd.Sum)  # still in step
    assert out.tolist() == [[float(n)] * 2]


def test_torch_allgather_into_travels_as_it_is(monkeypatch):
    # ZeroOptimizer gathers its updated shards so: each rank's rows already in place.
    from horovodlite.torch.tensors import TORCH_TENSORS

    from horovodlite.plan import run_now
    from horovodlite.tensor_plans import tensor_allgather_into_plan

    n, r = hvd.size(), hvd.rank()
    counts = [k % 2 + 1 for k in range(n)]
    start = sum(counts[:r])
    for layout in (lambda t: t, strided):
        out = layout(torch.zeros(sum(counts), 3))
        out[start : start + counts[r]] = r + 1
        plan = tensor_allgather_into_plan(out, TORCH_TENSORS, counts[r], "into", None)
        assert plan is not None and run_now(plan) is out
        np.testing.assert_array_equal(out[:, 0].numpy(), np.repeat(np.arange(1, n + 1), counts))
    # Beside numpy arrays on every other rank: the same calls on the same group.
    out = np.zeros((sum(counts), 2), np.float32)
    out[start : start + counts[r]] = r + 1
    if r % 2:
        hvd.allgather_into(out, counts[r], name="into.mixed")
    else:
        tensor = torch.from_numpy(out)
        run_now(tensor_allgather_into_plan(tensor, TORCH_TENSORS, counts[r], "into.mixed", None))
    np.testing.assert_array_equal(out[:, 0], np.repeat(np.arange(1, n + 1), counts))


@pytest.mark.parametrize(
    "collective", ["allgather", "broadcast", "alltoall", "reducescatter", "reducescatter_average",
                   "grouped_allgather", "grouped_reducescatter"],
)  # fmt: skip
def test_torch_movement_gradients_travel_as_they_are(moved_as_they_are, collective):
    # The forward and the backward pass both move the tensors as they are (the fixture refuses
    # any view); each rank's gradient is the adjoint's, from every rank's upstream gradient.
    n, r = hvd.size(), hvd.rank()
    rows = r + 1 if "allgather" in collective else 2 * n + 1
    x = torch.ones((rows, 3), dtype=torch.float64, requires_grad=True)
    ws = [
        rank_values((k, 3), np.float64, s, seed=92) for s, k in enumerate(_out_rows(collective, n))
    ]
    if collective == "allgather":
        y = hvd.torch.allgather(x)
    elif collective == "grouped_allgather":
        (y,) = hvd.torch.grouped_allgather([x])
    elif collective == "broadcast":
        y = hvd.torch.broadcast(x, n - 1)
    elif collective == "alltoall":
        y, _ = hvd.torch.alltoall(x, splits=_splits(rows, n, r))
    elif collective == "grouped_reducescatter":
        (y,) = hvd.torch.grouped_reducescatter([x], op=hvd.Sum)
    else:
        op = hvd.Average if collective.endswith("average") else hvd.Sum
        y = hvd.torch.reducescatter(x, op=op)
    (y * torch.from_numpy(ws[r])).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), _adjoint(collective, ws, n, r), rtol=1e-12)


def _splits(rows: int, n: int, r: int) -> list:
    """Rank r's all-to-all splits of `rows` rows: uneven, some empty, the rest to the last rank."""
    splits = [(r + k) % 2 for k in range(n)]
    splits[-1] += rows - sum(splits)
    return splits


def _out_rows(collective: str, n: int) -> list:
    """Each rank's rows of the collective's output (the upstream gradient's shape)."""
    if "allgather" in collective:
        return [n * (n + 1) // 2] * n
    if collective == "broadcast":
        return [2 * n + 1] * n
    if collective == "alltoall":
        return [sum(_splits(2 * n + 1, n, s)[k] for s in range(n)) for k in range(n)]
    base, extra = divmod(2 * n + 1, n)
    return [base + (k < extra) for k in range(n)]


def _adjoint(collective: str, ws: list, n: int, r: int) -> np.ndarray:
    """Rank r's input gradient of the sum of the ranks' losses (y_s * w_s).sum()."""
    if "allgather" in collective:  # this rank's rows of every rank's upstream gradient
        start = r * (r + 1) // 2
        return sum(w[start : start + r + 1] for w in ws)
    if collective == "broadcast":
        return sum(ws) if r == n - 1 else np.zeros_like(ws[0])
    if collective == "alltoall":  # the rows rank r sent to rank k come back from k's gradient
        parts = []
        for k in range(n):
            before = sum(_splits(2 * n + 1, n, s)[k] for s in range(r))
            parts.append(ws[k][before : before + _splits(2 * n + 1, n, r)[k]])
        return np.concatenate(parts)
    factor = 1 / n if collective.endswith("average") else 1.0
    return np.concatenate(ws) * factor  # each rank's rows of the reduction


def test_torch_movement_of_one_element_and_empty_tensors(moved_as_they_are):
    # torch calls a tensor of one element contiguous whatever its stride, and an empty one may
    # have stride 0 (an expanded gradient's): both are still moved, and written, where they lie.
    n, r = hvd.size(), hvd.rank()
    grid = torch.zeros(3, 4)
    grid[1, 2] = r + 1
    one = grid[1:2, 2]  # shape (1,), stride (4,)
    assert one.is_contiguous() and one.stride() == (4,)
    assert hvd.torch.broadcast_(one, n - 1) is one
    assert grid[1, 2].item() == n and grid.sum().item() == n  # written where it lies
    np.testing.assert_array_equal(hvd.torch.allgather(one).numpy(), np.full(n, float(n)))
    empty = torch.zeros(1, 3).expand(0, 3)
    assert hvd.torch.allgather(empty).shape == (0, 3)
    out = hvd.torch.allgather(empty if r % 2 else torch.ones(1, 3))
    assert out.shape == ((n + 1) // 2, 3) and out.sum().item() == 3 * ((n + 1) // 2)
    assert hvd.torch.broadcast(empty, 0).shape == (0, 3)
    assert hvd.torch.reducescatter(empty, op=hvd.Sum).shape == (0, 3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_torch_reducescatter_scales_as_the_views_do_bit_for_bit(moved_as_they_are, dtype):
    # Random values with factors that are no powers of two: the tensor way (torch's multiply)
    # gives the same bits as the general way on numpy arrays (staging.scale), even and uneven.
    n = hvd.size()
    rng = np.random.default_rng([93, hvd.rank()])
    for rows in (2 * n, 2 * n + 1):
        floats = torch.from_numpy(rng.standard_normal((rows, 3)).astype(np.float32))
        tensor = floats.to(getattr(torch, dtype))
        args = dict(op=hvd.Average, prescale_factor=0.3, postscale_factor=0.7)
        reference = hvd.reducescatter(as_numpy(tensor).copy(), name=f"rs.ref.{dtype}", **args)
        out = hvd.torch.reducescatter(tensor, name=f"rs.bits.{dtype}", **args)
        assert as_numpy(out).tobytes() == reference.tobytes()
    assert moved_as_they_are and None not in moved_as_they_are
