"""horovodlite.torch on every rank: collectives against numpy oracles, autograd, errors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import horovodlite.torch as hvd  # noqa: E402

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]  # fmt: skip


def rank_values(shape, dtype, rank):
    return (torch.arange(int(np.prod(shape))).reshape(shape) % 7 + rank).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_every_dtype(dtype):
    r, n = hvd.rank(), hvd.size()
    out = hvd.allreduce(rank_values((3, 5), dtype, r), op=hvd.Sum)
    expected = sum(rank_values((3, 5), torch.float64, k) for k in range(n))
    assert out.dtype == dtype
    torch.testing.assert_close(out.to(torch.float64), expected)


def test_allreduce_in_place_and_async_forms():
    r, n = hvd.rank(), hvd.size()
    t = torch.full((4,), float(r))
    assert hvd.allreduce_(t, op=hvd.Sum) is t
    assert t.tolist() == [n * (n - 1) / 2] * 4
    handle = hvd.allreduce_async(torch.full((2, 2), float(r)), name="async.avg")
    assert hvd.synchronize(handle).tolist() == [[(n - 1) / 2] * 2] * 2
    inplace = torch.ones(3)
    handle = hvd.allreduce_async_(inplace, name="async.inplace", op=hvd.Sum)
    assert hvd.synchronize(handle) is inplace
    assert inplace.tolist() == [float(n)] * 3
    assert hvd.poll(handle)


def test_non_contiguous_tensor():
    r = hvd.rank()
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
    view = base.t()
    expected = sum((torch.arange(12.0).reshape(3, 4) + k).t() for k in range(hvd.size()))
    torch.testing.assert_close(hvd.allreduce(view, op=hvd.Sum), expected)
    hvd.allreduce_(view, op=hvd.Sum)
    torch.testing.assert_close(base.t(), expected)


def test_grouped_allreduce_forms():
    n = hvd.size()
    tensors = [torch.ones(3), torch.full((2, 2), 2.0)]
    out = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    assert [o.tolist() for o in out] == [[n] * 3, [[2 * n] * 2] * 2]
    returned = hvd.grouped_allreduce_(tensors, op=hvd.Sum)
    assert all(a is b for a, b in zip(returned, tensors))
    assert tensors[0].tolist() == [n] * 3 and tensors[1].tolist() == [[2 * n] * 2] * 2
    # In place into a non-contiguous view and a tensor of another dtype, in one group.
    base, counts = torch.arange(12.0).reshape(3, 4), torch.arange(4, dtype=torch.int64)
    hvd.grouped_allreduce_([base.t(), counts], op=hvd.Sum, name="g.views")
    assert base.tolist() == (torch.arange(12.0).reshape(3, 4) * n).tolist()
    assert counts.tolist() == [k * n for k in range(4)]
    handle = hvd.grouped_allreduce_async([torch.ones(1), torch.ones(2)], name="g", op=hvd.Sum)
    assert [o.tolist() for o in hvd.synchronize(handle)] == [[n], [n, n]]


def test_allreduce_records_a_graph_only_where_a_gradient_is_needed():
    # Without an input that needs a gradient the forward runs without the autograd Function:
    # the same values, and a result with no grad_fn, as the Function gives under no_grad.
    n = hvd.size()
    x = torch.full((3,), float(hvd.rank()), requires_grad=True)
    recorded = [hvd.allreduce(x, op=hvd.Sum), *hvd.grouped_allreduce([x, x * 2], op=hvd.Sum)]
    with torch.no_grad():
        plain = [hvd.allreduce(x, op=hvd.Sum), *hvd.grouped_allreduce([x, x * 2], op=hvd.Sum)]
    detached = [hvd.allreduce(x.detach(), op=hvd.Sum)]
    assert all(t.grad_fn is not None for t in recorded)
    assert all(t.grad_fn is None and not t.requires_grad for t in plain + detached)
    total = float(n * (n - 1) / 2)
    for got, want in zip(recorded + plain + detached, [1, 1, 2, 1, 1, 2, 1]):
        assert got.tolist() == [want * total] * 3


def test_allreduce_gradient_is_allreduce():
    n = hvd.size()
    x = torch.full((3,), float(hvd.rank()), requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    assert x.grad.tolist() == [float(n)] * 3
    y = torch.ones(2, requires_grad=True)
    hvd.allreduce(y).mul(hvd.rank() + 1.0).sum().backward()  # Average
    assert y.grad.tolist() == pytest.approx([(n + 1) / 2] * 2)


def test_grouped_allreduce_gradient():
    n = hvd.size()
    a, b = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    outs = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    (outs[0].sum() + 2 * outs[1].sum()).backward()
    assert a.grad.tolist() == [float(n)] * 2 and b.grad.tolist() == [2.0 * n] * 3


def test_allgather_uneven_rows_and_gradient():
    r, n = hvd.rank(), hvd.size()
    x = torch.full((r + 1, 2), float(r), requires_grad=True)
    out = hvd.allgather(x)
    rows = [k for k in range(n) for _ in range(k + 1)]
    assert out[:, 0].tolist() == [float(k) for k in rows]
    out.sum().backward()  # each of the n ranks' losses reads every row once
    assert x.grad.tolist() == [[float(n)] * 2] * (r + 1)
    handle = hvd.grouped_allgather_async([torch.ones(1), torch.ones(r)], name="gag")
    first, second = hvd.synchronize(handle)
    assert first.shape[0] == n and second.shape[0] == sum(range(n))


def test_broadcast_forms_and_gradient():
    r, n = hvd.rank(), hvd.size()
    root = n - 1
    assert hvd.broadcast(torch.arange(3) * (r + 1), root).tolist() == [0, n, 2 * n]
    t = torch.full((2,), float(r))
    assert hvd.broadcast_(t, root) is t and t.tolist() == [float(root)] * 2
    handle = hvd.broadcast_async(torch.full((1,), float(r)), 0, name="b.async")
    assert hvd.synchronize(handle).tolist() == [0.0]
    x = torch.ones(2, requires_grad=True)
    hvd.broadcast(x, 0).sum().backward()  # each of the n ranks' losses reads the root's x
    assert x.grad.tolist() == ([float(n)] * 2 if r == 0 else [0.0, 0.0])


def test_alltoall_with_and_without_splits_and_gradient():
    r, n = hvd.rank(), hvd.size()
    out = hvd.alltoall(torch.arange(2 * n) + 100 * r)
    assert out.tolist() == [100 * k + 2 * r + j for k in range(n) for j in range(2)]
    splits = torch.tensor([r + 1 if k == (r + 1) % n else 0 for k in range(n)], dtype=torch.int32)
    rows = int(splits.sum())
    x = torch.full((rows, 2), float(r), requires_grad=True)
    received, received_splits = hvd.alltoall(x, splits=splits)
    sender = (r - 1) % n
    assert received_splits.dtype == torch.int32
    assert received_splits.tolist() == [sender + 1 if k == sender else 0 for k in range(n)]
    assert received[:, 0].tolist() == [float(sender)] * (sender + 1)
    (received * 3).sum().backward()
    assert x.grad.tolist() == [[3.0, 3.0]] * rows


def test_reducescatter_split_and_gradient():
    r, n = hvd.rank(), hvd.size()
    rows = 2 * n + 1
    x = torch.ones(rows, 3, requires_grad=True)
    out = hvd.reducescatter(x, op=hvd.Sum)
    assert out.shape == (rows // n + (1 if r < rows % n else 0), 3)
    assert out.unique().tolist() == [float(n)]
    out.sum().backward()
    # The ranks' losses add up every row of the sum once (Horovod's gradient is n times this).
    assert x.grad.tolist() == [[1.0] * 3] * rows
    averaged = hvd.synchronize(hvd.reducescatter_async(torch.full((n, 1), 2.0), name="rs"))
    assert averaged.tolist() == [[2.0]]


def test_sparse_allreduce():
    r, n = hvd.rank(), hvd.size()
    sparse = torch.sparse_coo_tensor([[r % 3]], [float(r + 1)], (3,))
    out = hvd.synchronize(hvd.sparse_allreduce_async(sparse, "sparse", hvd.Sum))
    expected = torch.zeros(3)
    for k in range(n):
        expected[k % 3] += k + 1
    torch.testing.assert_close(out.to_dense(), expected)


def test_compression_round_trip():
    n = hvd.size()
    x = torch.full((4,), 1.5, dtype=torch.float32)
    for compression in (hvd.Compression.fp16, hvd.Compression.bf16):
        out = hvd.allreduce(x, op=hvd.Sum, compression=compression)
        assert out.dtype == torch.float32 and out.tolist() == [1.5 * n] * 4
    ints = torch.ones(2, dtype=torch.int32)
    assert hvd.allreduce(ints, op=hvd.Sum, compression=hvd.Compression.fp16).dtype == torch.int32


def test_objects_and_join():
    r, n = hvd.rank(), hvd.size()
    assert hvd.broadcast_object({"r": r}, root_rank=0) == {"r": 0}
    assert hvd.allgather_object(r) == list(range(n))
    for _ in range(r):  # uneven work: rank r runs r extra all-reduces before joining
        out = hvd.synchronize(hvd.allreduce_async(torch.ones(2), name="uneven", op=hvd.Sum))
        assert out.tolist() == [float(sum(1 for k in range(n) if k >= _ + 1))] * 2
    assert hvd.join() == n - 1


def test_mismatched_shape_raises_on_every_rank():
    r = hvd.rank()
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(hvd.HorovodLiteError, match=r"rank 1 sent (shape )?\(4,\)"):
        hvd.allreduce(torch.ones(3 + (r == 1)), name="bad.shape")
    handle = hvd.allreduce_async(torch.ones(2, dtype=torch.float32 if r else torch.float64),
                                 name="bad.dtype")  # fmt: skip
    with pytest.raises(hvd.HorovodLiteError, match="dtype"):
        hvd.synchronize(handle)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()  # still in step


def test_bad_root_raises_on_every_rank():
    r, n = hvd.rank(), hvd.size()
    bad = n + 3 if r == 0 else 0
    error = ValueError if r == 0 else hvd.HorovodLiteError
    with pytest.raises(error, match=f"root_rank {n + 3}"):
        hvd.broadcast(torch.ones(2), bad, name="bad.root")


@pytest.mark.parametrize("algorithm", [None, "ring", "mpi"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_host_half_types_take_torchs_kernels_and_numpys_bits(monkeypatch, dtype, algorithm):
    # The binding lends the core torch's float16 and bfloat16 kernels (numpy's are 20x slower):
    # every path's reductions and scaling of large host arrays take them, and give the bits
    # that numpy's own give (an odd size, a prescale, Average's division, Sum; fused too).
    import ml_dtypes

    import horovodlite as core
    from horovodlite import ops

    numpy_dtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(hvd.rank())
    arrays = [rng.standard_normal(n).astype(np.float32).astype(numpy_dtype) for n in (5001, 3)]
    options = [dict(prescale_factor=1.5), dict(op=hvd.Sum)]
    lent, calls = ops._half_kernels, []

    class Counted(ops.HalfKernels):
        def combine(self, *args):
            calls.append("combine")
            lent.combine(*args)

        def multiply(self, *args):
            calls.append("multiply")
            lent.multiply(*args)

    def run(tag):
        ones = [core.allreduce(a, name=f"half.{tag}.{i}", algorithm=algorithm, **o)
                for i, (a, o) in enumerate(zip(arrays, options))]  # fmt: skip
        handles = [core.allreduce_async(a, name=f"half.{tag}.async.{i}", algorithm=algorithm,
                                        **options[0]) for i, a in enumerate(arrays)]  # fmt: skip
        return ones + [core.synchronize(h) for h in handles]

    monkeypatch.setattr(ops, "_half_kernels", None)
    numpys = run("numpy")
    monkeypatch.setattr(ops, "_half_kernels", Counted())
    torchs = run("torch")
    for got, want in zip(torchs, numpys):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert "multiply" in calls
    combined = any(hvd.allgather_object("combine" in calls))  # (MPI's own: not on every rank)
    on_mpi = core.transport.select(core.state.current().settings, np).name == "mpi"
    assert combined == (hvd.size() > 1 and on_mpi)  # (gloo reduces itself)
