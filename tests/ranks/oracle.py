"""Inputs and expected results for the multi-rank core tests: mpi4py moves, numpy computes."""

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import horovodlite as hvd

__all__ = [
    "ALGORITHMS",
    "adasum_expected",
    "DTYPES",
    "OPS",
    "assert_reduced",
    "dtype_id",
    "everyone",
    "expect_error_everywhere",
    "rank_values",
    "reduce_expected",
    "still_in_step",
]

WORLD = MPI.COMM_WORLD
ALGORITHMS = ["ring", "naive", "mpi", None]
OPS = [hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
# Sorted by name so that every rank parametrizes its tests in the same order.
DTYPES = sorted(hvd.buffers.SUPPORTED_DTYPES, key=str)

# Average of floats is a sum times 1/n rounded in the array's own dtype: allow a few ulps.
_AVERAGE_RTOL = {np.dtype(np.float16): 2e-3, np.dtype(ml_dtypes.bfloat16): 1.6e-2}


def dtype_id(dtype) -> str:
    """Return a test id for `dtype`: its name."""
    return np.dtype(dtype).name


def rank_values(shape, dtype, rank: int, seed: int = 0):
    """Return rank `rank`'s input: small integers, so every sum and product is exact."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng([seed, rank])
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    low = 0 if dtype.kind == "u" else -3
    return rng.integers(low, 5, size=shape).astype(dtype)


def everyone(array) -> list:
    """Return every rank's `array`, gathered with mpi4py's own allgather."""
    return WORLD.allgather(np.asarray(array))


def reduce_expected(inputs: list, op, prescale: float = 1.0, postscale: float = 1.0):
    """Return the reduction of the ranks' `inputs` as Horovod defines it, computed by numpy."""
    dtype = inputs[0].dtype
    shape = inputs[0].shape
    if dtype == np.bool_:
        stack = np.stack(inputs) if inputs else np.zeros((0, *shape), bool)
        combine = {hvd.Sum: np.any, hvd.Max: np.any, hvd.Min: np.all, hvd.Product: np.all}
        return combine[op](stack, axis=0)
    exact = np.int64 if dtype.kind in "iu" else np.float64
    # Each rank scales its input in its own dtype; integers truncate toward zero.
    stack = np.stack([_in_dtype(x.astype(np.float64) * prescale, dtype) for x in inputs])
    stack = stack.astype(exact)
    if op in (hvd.Sum, hvd.Average):
        total = stack.sum(axis=0)
    else:
        total = {hvd.Min: np.min, hvd.Max: np.max, hvd.Product: np.prod}[op](stack, axis=0)
    factor = postscale / len(inputs) if op == hvd.Average else postscale
    if exact is np.int64:
        # The sum wraps around like the ranks' integer arithmetic; the scaling truncates.
        return _in_dtype(total.astype(dtype).astype(np.float64) * factor, dtype)
    return (total * factor).astype(dtype)


def _in_dtype(values, dtype):
    if dtype.kind in "iu":
        return np.trunc(values).astype(np.int64).astype(dtype)
    return values.astype(dtype)


def assert_reduced(out, expected, op=None) -> None:
    """Assert `out` equals `expected`: exactly, or within rounding for a float Average."""
    assert out.dtype == expected.dtype, f"dtype {out.dtype}, expected {expected.dtype}"
    assert out.shape == expected.shape, f"shape {out.shape}, expected {expected.shape}"
    rtol = _AVERAGE_RTOL.get(out.dtype, 1e-6) if op == hvd.Average else 0
    if out.dtype.kind in "iub" or rtol == 0:
        np.testing.assert_array_equal(out, expected)
    else:
        np.testing.assert_allclose(
            out.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=rtol
        )


def expect_error_everywhere(call, faulty: set, own_error, *fragments) -> str:
    """Run `call` on every rank and check how it fails; return the exception's text.

    Ranks in `faulty` must raise `own_error`; the others a MismatchError whose text contains
    every string in `fragments` (the ranks and values at fault). An empty `faulty` means every
    rank raises MismatchError.
    """
    me = hvd.rank()
    expected = own_error if me in faulty else hvd.MismatchError
    with pytest.raises(expected) as info:
        call()
    text = str(info.value)
    if me not in faulty:
        assert isinstance(info.value, hvd.HorovodLiteError)
        assert isinstance(info.value, RuntimeError)
        for fragment in fragments:
            assert fragment in text, f"{fragment!r} missing from: {text}"
    return text


def still_in_step() -> None:
    """Check that the ranks still run their collectives in step after an error."""
    n, r = hvd.size(), hvd.rank()
    out = hvd.allreduce(np.array([r, 1], dtype=np.int64), op=hvd.Sum, name="after.error")
    np.testing.assert_array_equal(out, [n * (n - 1) // 2, n])
    assert hvd.allgather_object(r) == list(range(n))


def _adasum_pair(a, b):
    """Adasum of two vectors, as the paper and Horovod define it, in float64."""
    dot, anormsq, bnormsq = a @ b, a @ a, b @ b
    acoeff = 1 - dot / (2 * anormsq) if anormsq > 0 else 1.0
    bcoeff = 1 - dot / (2 * bnormsq) if bnormsq > 0 else 1.0
    return acoeff * a + bcoeff * b


def adasum_expected(inputs: list):
    """Adasum over ranks 0..n-1: pairs at distance 1, then pairs of pairs, ... (Horovod's tree)."""
    vectors = [np.asarray(x, dtype=np.float64).ravel() for x in inputs]
    while len(vectors) > 1:
        vectors = [_adasum_pair(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0].reshape(np.shape(inputs[0]))
