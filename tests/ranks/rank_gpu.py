"""The GPU data plane: CuPy arrays and torch CUDA tensors through every transport.

Skipped where there is no CUDA GPU: the CuPy tests need CuPy and a device on every rank, the
torch tests `torch.cuda.is_available()` on every rank (the ranks agree, so they all run or all
skip the same tests). Each rank uses GPU `local_rank % device count`: run one process per GPU
(docs/gpu.md). The NCCL transports need a GPU of their own per rank; where ranks share one they
are skipped.

Every collective runs through each transport that can move GPU buffers here:
- "mpi": the MPI library, CUDA-aware or not as it reports itself;
- "mpi-staged": the MPI library with the data staged through host memory;
- "nccl": torch.distributed's NCCL (needs torch with CUDA);
- "cupy-nccl": CuPy's NCCL binding.
Results must stay on the GPU and equal numpy's reduction of the same data (the oracle). Then the
torch DistributedOptimizer on a small model on the GPU must equal one process training on the
whole batch, and a mismatch on the GPU path must raise on every rank.
"""

import dataclasses
import socket

import numpy as np
import pytest
from oracle import ALGORITHMS, OPS, WORLD, assert_reduced, everyone, rank_values, reduce_expected

import horovodlite as hvd
from horovodlite import runtime, transport
from horovodlite.state import current

try:
    import cupy
except ImportError:
    cupy = None
try:
    import horovodlite.torch as hvd_torch  # registers the gloo and nccl transports
    import torch
except ImportError:
    torch = hvd_torch = None


def _device_count() -> int:
    if cupy is None:
        return 0
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:  # no driver, or no device
        return 0


def _torch_cuda() -> bool:
    return torch is not None and torch.cuda.is_available()


# Every rank must skip or run alike, or the ranks would call different collectives. Tests are
# skipped rather than the module, so that pytest still collects them and exits with 0.
CUPY_GPU = min(WORLD.allgather(_device_count())) > 0
TORCH_GPU = min(WORLD.allgather(_torch_cuda()))
needs_cupy = pytest.mark.skipif(
    not CUPY_GPU,
    reason="needs CuPy and a CUDA GPU on every rank"
    + ("" if cupy is not None else " (CuPy is not installed)"),
)
needs_torch_cuda = pytest.mark.skipif(
    not TORCH_GPU, reason="needs torch with CUDA and a GPU on every rank"
)

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_]
# transport setting, HOROVODLITE_CUDA_AWARE_MPI override (None: as the library reports)
ROUTES = {
    "mpi": ("mpi", None),
    "mpi-staged": ("mpi", "0"),
    "nccl": ("nccl", None),
    "cupy-nccl": ("cupy-nccl", None),
}


def _local_device() -> int:
    count = _device_count() or (torch.cuda.device_count() if _torch_cuda() else 1)
    return hvd.local_rank() % count


def _own_devices() -> bool:
    """Return whether every rank has a GPU of its own (NCCL refuses two ranks on one GPU)."""
    places = WORLD.allgather((socket.gethostname(), _local_device()))
    return len(set(places)) == len(places)


@pytest.fixture(params=list(ROUTES))
def route(request, monkeypatch):
    """Run a test with one transport for GPU buffers; skip it (on every rank) where missing."""
    name, aware = ROUTES[request.param]
    state = current()
    saved = state.settings
    chosen = dataclasses.replace(saved, transport=name)
    usable = transport.available(name, chosen)
    if not min(WORLD.allgather(usable)):
        pytest.skip(f"the {name} transport is not available on every rank")
    if name != "mpi" and not _own_devices():
        pytest.skip("NCCL needs one GPU per rank: run one process per GPU")
    if cupy is not None and _device_count():
        cupy.cuda.Device(_local_device()).use()
    if _torch_cuda():
        torch.cuda.set_device(_local_device())
    if aware is not None:
        monkeypatch.setenv("HOROVODLITE_CUDA_AWARE_MPI", aware)
    runtime.cuda_aware_mpi.cache_clear()
    state.settings = chosen
    yield request.param
    state.settings = saved
    monkeypatch.undo()
    runtime.cuda_aware_mpi.cache_clear()


def on_gpu(x):
    return cupy.asarray(x)


def assert_on_gpu(out) -> None:
    assert isinstance(out, cupy.ndarray), f"expected a CuPy array, got {type(out).__name__}"


# ---------------------------------------------------------------------------------------------
# CuPy arrays.


@needs_cupy
def test_the_route_is_the_one_asked_for(route):
    chosen = transport.select(current().settings, cupy, hvd.Sum, np.dtype(np.float32))
    expected = ROUTES[route][0]
    assert chosen.name == expected, f"{route}: moved by {chosen.name}"
    if route == "mpi-staged":
        assert not chosen.device


@needs_cupy
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce_on_gpu(route, algorithm, dtype):
    x = rank_values((3, 5), dtype, hvd.rank(), seed=40)
    inputs = everyone(x)
    for op in OPS:
        if dtype == np.bool_ and op == hvd.Average:
            continue
        expected = reduce_expected(inputs, op)
        out = hvd.allreduce(on_gpu(x), op=op, algorithm=algorithm)
        assert_on_gpu(out)
        assert_reduced(cupy.asnumpy(out), expected, op)
        target = on_gpu(x)
        assert hvd.allreduce_(target, op=op, algorithm=algorithm) is target
        assert_reduced(cupy.asnumpy(target), expected, op)


@needs_cupy
def test_gpu_shapes_views_and_scaling(route):
    n, r = hvd.size(), hvd.rank()
    for shape in ((0,), (), (n + 1,), (2 * n + 1, 3)):
        x = rank_values(shape, np.float32, r, seed=41)
        out = hvd.allreduce(on_gpu(x), op=hvd.Sum, postscale_factor=0.5)
        assert_reduced(cupy.asnumpy(out), reduce_expected(everyone(x), hvd.Sum, 1.0, 0.5))
    base = on_gpu(rank_values((6, 8), np.float64, r, seed=42))
    view = base[::2, 1::3]
    expected = reduce_expected(everyone(cupy.asnumpy(view)), hvd.Sum)
    before = cupy.asnumpy(base)
    hvd.allreduce_(view, op=hvd.Sum)
    after = cupy.asnumpy(base)
    assert_reduced(after[::2, 1::3], expected)
    mask = np.ones(after.shape, bool)
    mask[::2, 1::3] = False
    np.testing.assert_array_equal(after[mask], before[mask])


@needs_cupy
def test_gpu_large_buffer_is_identical_on_every_rank(route):
    rng = np.random.default_rng([43, hvd.rank()])
    x = rng.standard_normal(3 << 20).astype(np.float32)  # 12 MiB: several ring segments
    out = cupy.asnumpy(hvd.allreduce(on_gpu(x), op=hvd.Sum))
    assert len(set(WORLD.allgather(out.tobytes()))) == 1, f"{route}: ranks differ"
    exact = np.sum([v.astype(np.float64) for v in everyone(x)], axis=0)
    np.testing.assert_allclose(out, exact, rtol=1e-5, atol=1e-5)


@needs_cupy
def test_gpu_fused_engine_buffers(route):
    n, r = hvd.size(), hvd.rank()
    handles = [
        hvd.allreduce_async(on_gpu(np.full(k + 1, r, np.float32)), op=hvd.Sum, name=f"g{k}")
        for k in range(6)
    ]
    for k, handle in enumerate(handles):
        out = hvd.synchronize(handle)
        assert_on_gpu(out)
        np.testing.assert_array_equal(cupy.asnumpy(out), np.full(k + 1, n * (n - 1) / 2))


@needs_cupy
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
def test_gpu_fused_in_place_batches_come_back_scaled(route, dtype):
    # In-place arrays of one batch go into the fusion buffer and come back from it together
    # (one launch each way for float32 and float64, and for plain copies of any dtype) or one
    # by one (a factor on float16 or on integers, a strided array among them), the prescale
    # applied on the way in, the postscale on the way back.
    r = hvd.rank()
    factors = [(1.0, 1.0), (1.0, 2.0 if np.dtype(dtype).kind == "i" else 0.5)]
    factors.append(factors[-1][::-1])
    for prescale, factor in factors:
        for with_strided in (False, True):
            shapes = [(3,), (2, 5), (1,), (4, 4)]
            arrays = [on_gpu(rank_values(shape, dtype, r, seed=49 + k))
                      for k, shape in enumerate(shapes)]  # fmt: skip
            if with_strided:
                arrays.append(on_gpu(rank_values((4, 6), dtype, r, seed=59))[:, ::2])
            inputs = [everyone(cupy.asnumpy(a)) for a in arrays]
            handles = [
                hvd.allreduce_async_(a, op=hvd.Sum, prescale_factor=prescale,
                                     postscale_factor=factor, name=f"inplace.{k}")  # fmt: skip
                for k, a in enumerate(arrays)
            ]
            for array, handle, values in zip(arrays, handles, inputs):
                assert hvd.synchronize(handle) is array
                expected = reduce_expected(values, hvd.Sum, prescale, factor)
                np.testing.assert_array_equal(cupy.asnumpy(array), expected)


@needs_cupy
def test_gpu_data_movement(route):
    n, r = hvd.size(), hvd.rank()
    x = rank_values((2 * n, 3), np.float32, r, seed=44)
    for root in range(n):
        out = hvd.broadcast(on_gpu(x), root_rank=root)
        assert_on_gpu(out)
        np.testing.assert_array_equal(cupy.asnumpy(out), WORLD.bcast(x, root=root))
    target = on_gpu(x)
    hvd.broadcast_(target, root_rank=n - 1)
    np.testing.assert_array_equal(cupy.asnumpy(target), WORLD.bcast(x, root=n - 1))
    for rows in (x[:r], x[:2]):  # uneven, then even
        out = hvd.allgather(on_gpu(rows))
        assert_on_gpu(out)
        np.testing.assert_array_equal(cupy.asnumpy(out), np.concatenate(everyone(rows)))
    out = hvd.alltoall(on_gpu(x))
    expected = np.concatenate(WORLD.alltoall([x[2 * k : 2 * k + 2] for k in range(n)]))
    np.testing.assert_array_equal(cupy.asnumpy(out), expected)
    splits = [(r + k) % 3 for k in range(n)]
    y = rank_values((sum(splits), 2), np.int32, r, seed=45)
    out, received = hvd.alltoall(on_gpu(y), splits=splits)
    bounds = np.concatenate(([0], np.cumsum(splits)))
    expected = np.concatenate(WORLD.alltoall([y[bounds[k] : bounds[k + 1]] for k in range(n)]))
    np.testing.assert_array_equal(cupy.asnumpy(out), expected)
    assert received.tolist() == [(k + r) % 3 for k in range(n)]
    hvd.barrier()


@needs_cupy
@pytest.mark.parametrize("extra_row", [0, 1], ids=["even", "uneven"])
def test_gpu_reducescatter(route, extra_row):
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + extra_row
    x = rank_values((rows, 2), np.float32, r, seed=46)
    base, extra = divmod(rows, n)
    lo = r * base + min(r, extra)
    hi = lo + base + (1 if r < extra else 0)
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        out = hvd.reducescatter(on_gpu(x), op=op)
        assert_on_gpu(out)
        assert_reduced(cupy.asnumpy(out), reduce_expected(everyone(x), op)[lo:hi], op)


class CudaArrayInterfaceOnly:
    """A foreign GPU array: it exposes only `__cuda_array_interface__` (as Numba's do)."""

    def __init__(self, array):
        self._array = array
        self.__cuda_array_interface__ = array.__cuda_array_interface__


@needs_cupy
def test_foreign_gpu_arrays(route):
    n, r = hvd.size(), hvd.rank()
    x = cupy.full(4, float(r), dtype=cupy.float32)
    out = hvd.allreduce(CudaArrayInterfaceOnly(x), op=hvd.Sum)
    assert_on_gpu(out)
    np.testing.assert_array_equal(cupy.asnumpy(out), np.full(4, n * (n - 1) / 2))
    hvd.allreduce_(CudaArrayInterfaceOnly(x), op=hvd.Sum)  # writes into the producer's memory
    np.testing.assert_array_equal(cupy.asnumpy(x), np.full(4, n * (n - 1) / 2))


@needs_cupy
def test_gpu_mismatches_fail_on_every_rank(route):
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("a mismatch needs two ranks")
    x = np.ones(3, np.float32)
    with pytest.raises(hvd.MismatchError, match="device"):
        hvd.allreduce(on_gpu(x) if r == n - 1 else x, name="mixed")
    with pytest.raises(hvd.MismatchError, match="shape"):
        hvd.allreduce(on_gpu(np.ones(3 + (r == 0), np.float32)), name="gpu.shape")
    with pytest.raises(hvd.MismatchError, match="dtype"):
        hvd.allgather(on_gpu(np.ones(2, np.float32 if r else np.float64)), name="gpu.dtype")
    np.testing.assert_array_equal(cupy.asnumpy(hvd.allreduce(on_gpu(np.ones(1)), op=hvd.Sum)), [n])


# ---------------------------------------------------------------------------------------------
# torch CUDA tensors through horovodlite.torch.


def _cuda(x) -> "torch.Tensor":
    return torch.as_tensor(np.asarray(x)).cuda()


@needs_torch_cuda
def test_torch_cuda_collectives(route):
    n, r = hvd.size(), hvd.rank()
    x = rank_values((2 * n + 1, 3), np.float32, r, seed=47)
    inputs = everyone(x)
    for op in (hvd.Average, hvd.Sum, hvd.Max):
        out = hvd_torch.allreduce(_cuda(x), op=op)
        assert out.is_cuda
        assert_reduced(out.cpu().numpy(), reduce_expected(inputs, op), op)
    target = _cuda(x)
    hvd_torch.allreduce_(target, op=hvd.Sum)
    assert_reduced(target.cpu().numpy(), reduce_expected(inputs, hvd.Sum))
    outs = hvd_torch.grouped_allreduce([_cuda(x), _cuda(x[:1])], op=hvd.Sum)
    assert_reduced(outs[1].cpu().numpy(), reduce_expected(inputs, hvd.Sum)[:1])
    out = hvd_torch.allgather(_cuda(x[: r + 1]))
    assert out.is_cuda
    np.testing.assert_array_equal(out.cpu().numpy(), np.concatenate(everyone(x[: r + 1])))
    out = hvd_torch.broadcast(_cuda(x), root_rank=n - 1)
    np.testing.assert_array_equal(out.cpu().numpy(), WORLD.bcast(x, root=n - 1))
    y = rank_values((2 * n, 2), np.int64, r, seed=48)
    expected = np.concatenate(WORLD.alltoall([y[2 * k : 2 * k + 2] for k in range(n)]))
    np.testing.assert_array_equal(hvd_torch.alltoall(_cuda(y)).cpu().numpy(), expected)
    base, extra = divmod(2 * n + 1, n)
    lo = r * base + min(r, extra)
    hi = lo + base + (1 if r < extra else 0)
    out = hvd_torch.reducescatter(_cuda(x), op=hvd.Sum)
    assert_reduced(out.cpu().numpy(), reduce_expected(inputs, hvd.Sum)[lo:hi])
    half = hvd_torch.allreduce(_cuda(x).to(torch.bfloat16), op=hvd.Sum)  # staged: CuPy has no bf16
    assert half.is_cuda and half.dtype == torch.bfloat16


def _make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    ).cuda()


@needs_torch_cuda
def test_distributed_optimizer_on_gpu_equals_one_process(route):
    r, n = hvd.rank(), hvd.size()
    generator = torch.Generator().manual_seed(1234)
    batches = [
        (torch.randn(4 * n, 6, generator=generator), torch.randn(4 * n, 1, generator=generator))
        for _ in range(3)
    ]
    model = _make_model(seed=r)  # different on purpose: broadcast_parameters must fix it
    optimizer = hvd_torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    hvd_torch.broadcast_parameters(model.state_dict(), root_rank=0)
    for x, y in batches:
        optimizer.zero_grad()
        mine = slice(4 * r, 4 * r + 4)
        torch.nn.functional.mse_loss(model(x[mine].cuda()), y[mine].cuda()).backward()
        optimizer.step()
    reference = _make_model(seed=0)
    one = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        one.zero_grad()
        torch.nn.functional.mse_loss(reference(x.cuda()), y.cuda()).backward()
        one.step()
    for got, want in zip(model.parameters(), reference.parameters()):
        assert got.is_cuda
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@needs_torch_cuda
def test_broadcast_optimizer_state_keeps_host_state_on_the_host(route):
    # Only the root has stepped (a checkpoint it loaded): its Adam keeps `step` on the host
    # beside the GPU moments. Every rank makes each tensor where the root has it, so the
    # broadcasts meet one transport, and Adam (not capturable) steps on every rank after.
    model = _make_model(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = torch.randn(4, 6).cuda(), torch.randn(4, 1).cuda()
    if hvd.rank() == 0:
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    hvd_torch.broadcast_optimizer_state(optimizer, root_rank=0)
    state = optimizer.state_dict()["state"]
    for entries in state.values():
        assert not entries["step"].is_cuda and entries["exp_avg"].is_cuda
        assert float(entries["step"]) == 1.0
    expected = hvd.broadcast_object([e["exp_avg"].cpu() for e in state.values()], root_rank=0)
    for entries, want in zip(state.values(), expected):
        assert torch.equal(entries["exp_avg"].cpu(), want)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


@needs_torch_cuda
def test_torch_cuda_on_a_side_stream(route):
    # Inputs made on a side stream behind a slow kernel, results read on it: the all-reduces
    # (the tensor itself on NCCL, a view of it elsewhere, the engine's) must order themselves
    # after that work and before the reads, with no host wait on the caller's side.
    n, r = hvd.size(), hvd.rank()
    total = n * (n - 1) / 2
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        slow = torch.ones(2048, 2048, device="cuda")
        for _ in range(8):
            slow = slow @ slow / 2048  # stays ones, and keeps the stream busy
        x = slow[0, :1000] * r  # ready only once the products are done
        out = hvd_torch.allreduce(x, op=hvd.Sum, name="side.out")
        y = x.clone()
        hvd_torch.allreduce_(y, op=hvd.Sum, name="side.in")
        z = x.clone()
        hvd_torch.synchronize(hvd_torch.allreduce_async_(z, op=hvd.Sum, name="side.async"))
        # A blocking group on this stream, in place: its batch buffer is this stream's own.
        group = [x.clone(), x[:10].clone()]
        hvd_torch.grouped_allreduce_(group, op=hvd.Sum, name="side.group")
        got = [t.cpu().numpy() for t in (out, y, z, group[0])]  # read on the side stream
    names = ("allreduce", "allreduce_", "allreduce_async_", "grouped_allreduce_")
    for name, value in zip(names, got):
        np.testing.assert_array_equal(value, np.full(1000, total, np.float32), err_msg=name)


def _watch_the_tensor_way(monkeypatch) -> tuple:
    """Return (whether CUDA tensors travel as they are here, the sizes of the batches the engine
    joins into one torch buffer, filled as the test runs); on NCCL a view of one fails the test."""
    from horovodlite.torch import mpi_ops
    from horovodlite.torch.tensors import TORCH_TENSORS

    as_they_are = current().settings.transport == "nccl"
    if as_they_are:
        def refuse(tensor):
            raise AssertionError("a CUDA tensor was viewed on NCCL")

        monkeypatch.setattr(mpi_ops, "TensorView", refuse)
    joined, join = [], TORCH_TENSORS.join

    def spy(tensors, *args, **kwargs):
        joined.append(len(tensors))
        return join(tensors, *args, **kwargs)

    monkeypatch.setattr(TORCH_TENSORS, "join", spy)
    return as_they_are, joined


# The shapes of the CUDA batches below; the last is laid out channels_last (_laid_out).
CUDA_SHAPES = [(3,), (2, 5), (), (0, 3), (130, 130), (7,), (2, 3, 4, 5)]


def _laid_out(xs: list) -> list:
    """Return `xs` with the last one channels_last (a channels_last model's gradient)."""
    return xs[:-1] + [xs[-1].contiguous(memory_format=torch.channels_last)]


@needs_torch_cuda
def test_torch_cuda_async_tensors_travel_as_they_are(route, monkeypatch):
    # On NCCL the engine joins a batch of CUDA tensors into one torch buffer and splits it back
    # (fusion.TensorEntry): no CuPy view; elsewhere they go as views. Alike either way: in place
    # and not, a group, a scalar, an empty tensor, a large one, one channels_last, scaled.
    r = hvd.rank()
    as_they_are, joined = _watch_the_tensor_way(monkeypatch)
    for _ in range(2):
        bases = [rank_values(s, np.float32, r, seed=360 + i) for i, s in enumerate(CUDA_SHAPES)]
        xs = _laid_out([_cuda(base) for base in bases])
        options = dict(op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5)
        handles = [(hvd_torch.allreduce_async_ if i % 2 else hvd_torch.allreduce_async)(
                       x, name=f"cuda.async.{i}", **options) for i, x in enumerate(xs)]  # fmt: skip
        for i, (handle, x, base) in enumerate(zip(handles, xs, bases)):
            out = hvd_torch.synchronize(handle)
            assert out.is_cuda and (out is x) == bool(i % 2)
            expected = reduce_expected(everyone(base), hvd.Average, 2.0, 0.5)
            assert_reduced(out.cpu().numpy(), expected, hvd.Average)
        before = [x.cpu().numpy() for x in xs]
        group = hvd_torch.grouped_allreduce_async_(xs, op=hvd.Sum, name="cuda.group")
        for out, x, value in zip(hvd_torch.synchronize(group), xs, before):
            assert out is x and out.is_cuda
            assert_reduced(x.cpu().numpy(), reduce_expected(everyone(value), hvd.Sum))
        outs = hvd_torch.grouped_allreduce(xs, op=hvd.Max, name="cuda.group.now")
        for out, x in zip(outs, xs):
            assert out.is_cuda and out is not x
            assert_reduced(out.cpu().numpy(), reduce_expected(everyone(x.cpu().numpy()), hvd.Max))
    assert bool(joined) == as_they_are


@needs_torch_cuda
@pytest.mark.parametrize("case", ["bfloat16", "no CuPy"])
def test_torch_cuda_tensors_no_cupy_array_holds_stay_on_the_gpu(route, case, monkeypatch):
    # bfloat16 CUDA tensors (CuPy has no bfloat16), and every CUDA tensor where CuPy is missing
    # (as the binding sees it here), have no CuPy view: their views are staged through host
    # memory. On NCCL they travel as they are instead, async (fused), grouped and sync (with a
    # factor too), no view made, one channels_last among them; elsewhere they are staged, and
    # reduce alike. Values that bfloat16 holds exactly.
    from horovodlite.torch import tensors

    if case == "no CuPy":
        monkeypatch.setattr(tensors, "cupy_holds", lambda dtype: False)
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    as_they_are, joined = _watch_the_tensor_way(monkeypatch)
    r = hvd.rank()

    def host(x):
        return x.float().cpu().numpy()

    for _ in range(2):
        bases = [(np.arange(int(np.prod(s))).reshape(s) % 7 + r + i).astype(np.float32)
                 for i, s in enumerate(CUDA_SHAPES)]  # fmt: skip
        xs = _laid_out([_cuda(base).to(dtype) for base in bases])
        options = dict(op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5)
        starts = [hvd_torch.allreduce_async_ if i % 2 else hvd_torch.allreduce_async
                  for i in range(len(xs))]  # fmt: skip
        handles = [start(x, name=f"cuda.nocupy.{case}.{i}", **options)
                   for i, (start, x) in enumerate(zip(starts, xs))]  # fmt: skip
        for i, (handle, x, base) in enumerate(zip(handles, xs, bases)):
            out = hvd_torch.synchronize(handle)
            assert out.is_cuda and out.dtype == dtype and (out is x) == bool(i % 2)
            expected = reduce_expected(everyone(base), hvd.Average, 2.0, 0.5)
            np.testing.assert_array_equal(host(out), expected)
        before = [host(x) for x in xs]
        group = hvd_torch.grouped_allreduce_async_(xs, op=hvd.Sum, name=f"cuda.nocupy.{case}")
        for out, x, value in zip(hvd_torch.synchronize(group), xs, before):
            assert out is x and out.is_cuda and out.dtype == dtype
            np.testing.assert_array_equal(host(x), reduce_expected(everyone(value), hvd.Sum))
        outs = hvd_torch.grouped_allreduce(xs, op=hvd.Max, name=f"cuda.nocupy.now.{case}")
        for out, x in zip(outs, xs):
            assert out.is_cuda and out.dtype == dtype and out is not x
            np.testing.assert_array_equal(host(out), reduce_expected(everyone(host(x)), hvd.Max))
        out = hvd_torch.allreduce(xs[1], op=hvd.Min, name=f"cuda.nocupy.sync.{case}")
        assert out.is_cuda and out.dtype == dtype
        np.testing.assert_array_equal(host(out), reduce_expected(everyone(host(xs[1])), hvd.Min))
        for start in (hvd_torch.allreduce, hvd_torch.allreduce_):  # a factor: not the short way
            x, value = xs[4].clone(), host(xs[4])
            out = start(x, name=f"cuda.nocupy.scaled.{case}", **options)
            assert out.is_cuda and out.dtype == dtype
            assert (out is x) == (start is hvd_torch.allreduce_)
            expected = reduce_expected(everyone(value), hvd.Average, 2.0, 0.5)
            np.testing.assert_array_equal(host(out), expected)
    assert bool(joined) == as_they_are


@needs_torch_cuda
def test_torch_cuda_float16_is_scaled_as_cupy_scales(route):
    # float16 CUDA tensors with a factor travel as they are on NCCL, torch multiplying by the
    # factor rounded to float16 as CuPy's view would be: a group of them against the same group
    # of CuPy arrays (the general way), bit for bit, on every route.
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng([390, hvd.rank()])
    shapes = [(3,), (2, 5), (), (200, 200), (7,)]
    values = [rng.standard_normal(s).astype(np.float16) for s in shapes]
    options = dict(prescale_factor=1.5, postscale_factor=0.7)  # (and 1/n: Average)
    references = hvd.grouped_allreduce([cupy.asarray(v) for v in values], name="cuda.half.ref",
                                       **options)  # fmt: skip
    for grouped in (hvd_torch.grouped_allreduce, hvd_torch.grouped_allreduce_):
        outs = grouped([_cuda(v) for v in values], name="cuda.half", **options)
        for out, reference in zip(outs, references):
            assert out.cpu().numpy().tobytes() == cupy.asnumpy(reference).tobytes()


@needs_torch_cuda
def test_torch_sync_batch_norm_on_cuda_matches_batch_norm_on_the_global_batch(route):
    # SyncBatchNorm on CUDA inputs: its statistics travel as one CUDA tensor (its count made on
    # the input's device: torch.cat took no CPU tensor beside CUDA ones), and the output, the
    # running statistics and the input's gradient equal BatchNorm's over the whole batch.
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(7)
    x = torch.randn(2 * n, 3, 5, dtype=torch.float64)
    sync = hvd_torch.SyncBatchNorm(3).double().cuda()
    plain = torch.nn.BatchNorm1d(3).double()
    mine = x[2 * r : 2 * r + 2].cuda().requires_grad_()
    whole = x.clone().requires_grad_()
    out = sync(mine)
    expected = plain(whole)
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), expected[2 * r : 2 * r + 2].detach())
    torch.testing.assert_close(sync.running_mean.cpu(), plain.running_mean)
    torch.testing.assert_close(sync.running_var.cpu(), plain.running_var)
    weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weights.cuda()).sum().backward()
    (expected * torch.cat(hvd.allgather_object(weights))).sum().backward()
    torch.testing.assert_close(mine.grad.cpu(), whole.grad[2 * r : 2 * r + 2])


@needs_torch_cuda
def test_torch_cuda_mismatch_fails_on_every_rank(route):
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("a mismatch needs two ranks")
    with pytest.raises(hvd.MismatchError, match="shape"):
        hvd_torch.allreduce(torch.ones(3 + (r == 0), device="cuda"), name="torch.gpu.shape")
    out = hvd_torch.allreduce(torch.ones(2, device="cuda"), op=hvd.Sum)
    np.testing.assert_array_equal(out.cpu().numpy(), [n, n])


@needs_torch_cuda
@pytest.mark.parametrize("case", ["float32", "bfloat16", "no CuPy"])
def test_torch_cuda_movement_travels_as_it_is(route, case, monkeypatch):
    # Broadcast, all-gather, all-to-all and reduce-scatter of CUDA tensors (and their gradients)
    # travel as they are on torch's NCCL, no view made: bfloat16, and everything without CuPy,
    # stay on the GPU. Elsewhere they go as views, and move alike. Sync and async, grouped, a
    # strided input, and async from a side stream (the engine's stream waits for it), all-reduces
    # included.
    from horovodlite.torch import tensors

    if case == "no CuPy":
        monkeypatch.setattr(tensors, "cupy_holds", lambda dtype: False)
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    _watch_the_tensor_way(monkeypatch)
    n, r = hvd.size(), hvd.rank()

    def host(x):
        return x.float().cpu().numpy()

    base = (np.arange((2 * n + 1) * 3).reshape(-1, 3) % 7 + r).astype(np.float32)
    x = _cuda(base).to(dtype)
    strided = x.t().contiguous().t()
    for tensor in (x, strided):
        out = hvd_torch.broadcast(tensor, n - 1)
        assert out.is_cuda and out.dtype == dtype
        np.testing.assert_array_equal(host(out), WORLD.bcast(base, n - 1))
        target = tensor.clone()
        assert hvd_torch.broadcast_(target, 0) is target
        np.testing.assert_array_equal(host(target), WORLD.bcast(base, 0))
        out = hvd_torch.allgather(tensor[: r + 1])
        np.testing.assert_array_equal(host(out), np.concatenate(everyone(base[: r + 1])))
        out = hvd_torch.reducescatter(tensor, op=hvd.Sum)
        base_rows, extra = divmod(2 * n + 1, n)
        lo = r * base_rows + min(r, extra)
        expected = reduce_expected(everyone(base), hvd.Sum)[lo : lo + base_rows + (r < extra)]
        np.testing.assert_array_equal(host(out), expected)
    splits = [(r + k) % 2 for k in range(n)]
    splits[-1] += 2 * n + 1 - sum(splits)
    out, received = hvd_torch.alltoall(x, splits=splits)
    bounds = np.concatenate(([0], np.cumsum(splits)))
    expected = np.concatenate(WORLD.alltoall([base[bounds[k] : bounds[k + 1]] for k in range(n)]))
    np.testing.assert_array_equal(host(out), expected)
    outs = hvd_torch.grouped_allgather([x, x[:1]])
    np.testing.assert_array_equal(host(outs[1]), np.concatenate(everyone(base[:1])))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        slow = torch.ones(2048, 2048, device="cuda")
        for _ in range(8):
            slow = slow @ slow / 2048  # stays ones, and keeps the stream busy
        y = (slow[:4, :3] * r).to(dtype)  # ready only once the products are done
        handles = [hvd_torch.allgather_async(y), hvd_torch.broadcast_async(y, n - 1)]
        # The engine's all-reduces of side-stream tensors travel as they are too (the tensor
        # way, no view: before, views, staged for bfloat16 and without CuPy).
        handles.append(hvd_torch.allreduce_async(y, op=hvd.Sum))
        group = [y.clone(), y[:1].clone()]
        handles.append(hvd_torch.grouped_allreduce_async_(group, op=hvd.Sum))
        got = [hvd_torch.synchronize(h) for h in handles]
        assert got[3][0] is group[0]
        got = [host(got[0]), host(got[1]), host(got[2]), host(group[0]), host(group[1])]
        # (read on the side stream)
    np.testing.assert_array_equal(got[0], np.concatenate([np.full((4, 3), s) for s in range(n)]))
    np.testing.assert_array_equal(got[1], np.full((4, 3), n - 1))
    total = n * (n - 1) / 2
    for value, rows in ((got[2], 4), (got[3], 4), (got[4], 1)):
        np.testing.assert_array_equal(value, np.full((rows, 3), total))
    z = _cuda(base).requires_grad_()
    gathered = hvd_torch.allgather(z)
    (gathered.float() * (r + 1)).sum().backward()
    np.testing.assert_array_equal(z.grad.cpu().numpy(), np.full(base.shape, n * (n + 1) / 2))
