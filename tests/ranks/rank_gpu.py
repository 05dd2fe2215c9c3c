"""The core collectives on CuPy arrays; skipped where CuPy or a CUDA GPU is missing.

Every rank uses GPU `local_rank % device count`. Results must stay on the GPU and equal numpy's
reduction of the same data, both with the MPI library's own GPU support (if any) and with
horovodlite staging the data through host memory.
"""

import numpy as np
import pytest
from oracle import ALGORITHMS, OPS, WORLD, assert_reduced, everyone, rank_values, reduce_expected

import horovodlite as hvd
from horovodlite import runtime

try:
    import cupy
except ImportError:
    cupy = None


def _device_count() -> int:
    if cupy is None:
        return 0
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:  # no driver, or no device
        return 0


# Every rank must skip or run alike, or the ranks would call different collectives. The tests
# are skipped rather than the module, so that pytest still collects them and exits with 0.
pytestmark = pytest.mark.skipif(
    min(WORLD.allgather(_device_count())) == 0,
    reason="needs CuPy and a CUDA GPU on every rank"
    + ("" if cupy is not None else " (CuPy is not installed)"),
)

DTYPES = [np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_]


@pytest.fixture(autouse=True, params=["as the MPI library can", "staged through the host"])
def transfer(request, monkeypatch):
    """Run each test with the detected CUDA-awareness, then forcing host staging."""
    cupy.cuda.Device(hvd.local_rank() % _device_count()).use()
    if request.param == "staged through the host":
        monkeypatch.setenv("HOROVODLITE_CUDA_AWARE_MPI", "0")
    runtime.cuda_aware_mpi.cache_clear()
    yield request.param
    monkeypatch.undo()
    runtime.cuda_aware_mpi.cache_clear()


def on_gpu(x):
    return cupy.asarray(x)


def assert_on_gpu(out) -> None:
    assert isinstance(out, cupy.ndarray), f"expected a CuPy array, got {type(out).__name__}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce_on_gpu(algorithm, dtype):
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


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gpu_shapes_views_and_scaling(algorithm):
    n, r = hvd.size(), hvd.rank()
    for shape in ((0,), (), (n + 1,), (2 * n + 1, 3)):
        x = rank_values(shape, np.float32, r, seed=41)
        out = hvd.allreduce(on_gpu(x), op=hvd.Sum, algorithm=algorithm, postscale_factor=0.5)
        assert_reduced(cupy.asnumpy(out), reduce_expected(everyone(x), hvd.Sum, 1.0, 0.5))
    base = on_gpu(rank_values((6, 8), np.float64, r, seed=42))
    view = base[::2, 1::3]
    expected = reduce_expected(everyone(cupy.asnumpy(view)), hvd.Sum)
    before = cupy.asnumpy(base)
    hvd.allreduce_(view, op=hvd.Sum, algorithm=algorithm)
    after = cupy.asnumpy(base)
    assert_reduced(after[::2, 1::3], expected)
    mask = np.ones(after.shape, bool)
    mask[::2, 1::3] = False
    np.testing.assert_array_equal(after[mask], before[mask])


def test_gpu_large_buffer_is_identical_on_every_rank():
    rng = np.random.default_rng([43, hvd.rank()])
    x = rng.standard_normal(3 << 20).astype(np.float32)  # 12 MiB: several ring segments
    for algorithm in ALGORITHMS:
        out = cupy.asnumpy(hvd.allreduce(on_gpu(x), op=hvd.Sum, algorithm=algorithm))
        assert len(set(WORLD.allgather(out.tobytes()))) == 1, f"{algorithm}: ranks differ"
        exact = np.sum([v.astype(np.float64) for v in everyone(x)], axis=0)
        np.testing.assert_allclose(out, exact, rtol=1e-5, atol=1e-5)


def test_gpu_data_movement():
    n, r = hvd.size(), hvd.rank()
    x = rank_values((2 * n, 3), np.float32, r, seed=44)
    for root in range(n):
        out = hvd.broadcast(on_gpu(x), root_rank=root)
        assert_on_gpu(out)
        np.testing.assert_array_equal(cupy.asnumpy(out), WORLD.bcast(x, root=root))
    target = on_gpu(x)
    hvd.broadcast_(target, root_rank=n - 1)
    np.testing.assert_array_equal(cupy.asnumpy(target), WORLD.bcast(x, root=n - 1))
    rows = x[:r]
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


@pytest.mark.parametrize("algorithm", ["ring", "mpi", None])
def test_gpu_reducescatter(algorithm):
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1
    x = rank_values((rows, 2), np.float32, r, seed=46)
    base, extra = divmod(rows, n)
    lo = r * base + min(r, extra)
    hi = lo + base + (1 if r < extra else 0)
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        out = hvd.reducescatter(on_gpu(x), op=op, algorithm=algorithm)
        assert_on_gpu(out)
        assert_reduced(cupy.asnumpy(out), reduce_expected(everyone(x), op)[lo:hi], op)


class CudaArrayInterfaceOnly:
    """A foreign GPU array: it exposes only `__cuda_array_interface__` (as Numba's do)."""

    def __init__(self, array):
        self._array = array
        self.__cuda_array_interface__ = array.__cuda_array_interface__


def test_foreign_gpu_arrays():
    n, r = hvd.size(), hvd.rank()
    x = cupy.full(4, float(r), dtype=cupy.float32)
    out = hvd.allreduce(CudaArrayInterfaceOnly(x), op=hvd.Sum)
    assert_on_gpu(out)
    np.testing.assert_array_equal(cupy.asnumpy(out), np.full(4, n * (n - 1) / 2))
    hvd.allreduce_(CudaArrayInterfaceOnly(x), op=hvd.Sum)  # writes into the producer's memory
    np.testing.assert_array_equal(cupy.asnumpy(x), np.full(4, n * (n - 1) / 2))


def test_gpu_and_host_mismatch_fails_on_every_rank():
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("a mismatch needs two ranks")
    x = np.ones(3, np.float32)
    with pytest.raises(hvd.MismatchError, match="device"):
        hvd.allreduce(on_gpu(x) if r == n - 1 else x, name="mixed")
    np.testing.assert_array_equal(hvd.allreduce(np.ones(1), op=hvd.Sum), [n])
