"""Reduce operations, the deprecated `average=` argument, and local reduction kernels."""

import enum
import warnings

import ml_dtypes
import numpy as np

__all__ = [
    "ReduceOp",
    "Average",
    "Sum",
    "Min",
    "Max",
    "Product",
    "Adasum",
    "resolve_op",
    "combined_as",
    "result_factor",
    "HalfKernels",
    "use_half_kernels",
    "half_kernels_for",
]


class ReduceOp(enum.IntEnum):
    """How an all-reduce or reduce-scatter combines the ranks' values."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


# Average is a Sum, then a division by the set's size: these two functions say so, once. Every
# algorithm and transport combines contributions with `combined_as(op)` (so none of their op
# tables lists Average), and the result is multiplied by `result_factor` once, so every path
# rounds the same way.


# Both run on every small all-reduce: they compare a resolved op (a member, as resolve_op gives)
# by identity with the members bound above, not through the Enum's class attribute and `==`.


def combined_as(op: ReduceOp) -> ReduceOp:
    """Return the op that combines the ranks' contributions: Sum for Average, else `op`."""
    return Sum if op is Average else op


def result_factor(op: ReduceOp, postscale: float, size: int) -> float:
    """Return what the combined result is multiplied by: `postscale`, over `size` for Average."""
    return postscale / size if op is Average else postscale


# The elementwise kernel that combines two contributions.
_UFUNC_NAME = {
    ReduceOp.SUM: "add",
    ReduceOp.MIN: "minimum",
    ReduceOp.MAX: "maximum",
    ReduceOp.PRODUCT: "multiply",
}


def resolve_op(
    op, average, default: ReduceOp = ReduceOp.AVERAGE, *, stacklevel: int = 3
) -> ReduceOp:
    """Return the ReduceOp from `op` and Horovod's deprecated `average` flag.

    `stacklevel` is the warning's, counted from here: it should name the user's call.
    """
    if op is not None and average is not None:
        raise ValueError("give either op= or the deprecated average=, not both")
    if average is not None:
        warnings.warn(
            "average= is deprecated: use op=Average or op=Sum",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        return ReduceOp.AVERAGE if average else ReduceOp.SUM
    if op is None:
        return default
    if type(op) is ReduceOp:
        return op
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            pass
    try:
        return ReduceOp(op)
    except ValueError:
        raise ValueError(
            f"unknown reduce op {op!r}: use one of Average, Sum, Min, Max, Product"
        ) from None
    except TypeError:
        raise TypeError(f"op must be a ReduceOp such as hvd.Sum, got {type(op).__name__}") from None


def reduce_into(xp, acc, incoming, op: ReduceOp) -> None:
    """Combine `incoming` into `acc` in place with array module `xp` (numpy or cupy)."""
    if (op is Sum or op is Product) and (kernels := half_kernels_for(acc, incoming)) is not None:
        kernels.combine(acc, incoming, op)
        return
    getattr(xp, _UFUNC_NAME[op])(acc, incoming, out=acc)


# -- a framework's kernels for half types on the host -------------------------------------------
# numpy computes float16 and bfloat16 (ml_dtypes') one element at a time in software: adding two
# float16 arrays of 12.8 M elements takes 45.6 ms here, torch's vectorized add 1.9 ms (numpy's
# float32 add 2.3), so Compression.fp16 made ResNet-50's all-reduce 5x slower than float32 on the
# host (docs/benchmarks.md). A binding may lend its framework's kernels for these types; they
# must round as numpy does, bit for bit (float32 math, one rounding to the half type), so a rank
# without them computes the same result. Only Sum and Product go to them (Min and Max may order
# signed zeros their own way), and only arrays of _HALF_KERNEL_MIN_SIZE elements or more: below
# it numpy's own costs less than making the framework's views (1024 float16: 3.9 µs against 2.1).


class HalfKernels:
    """Host kernels for float16 and bfloat16 numpy arrays, rounding as numpy's own."""

    def combine(self, acc, incoming, op: ReduceOp) -> None:
        """`acc` += `incoming` (Sum) or `acc` *= `incoming` (Product), in place."""
        raise NotImplementedError

    def multiply(self, source, factor: float, out) -> None:
        """`out` = `source` * `factor`, in float32 math with a float32 factor (staging.scale's
        rounding); `out` may be `source`."""
        raise NotImplementedError


_HALF_TYPES = frozenset({np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})
_HALF_KERNEL_MIN_SIZE = 1024
_half_kernels = None


def use_half_kernels(kernels) -> None:
    """Lend the core `kernels` (a HalfKernels) for host half-type arrays; None takes numpy's."""
    global _half_kernels
    _half_kernels = kernels


def half_kernels_for(out, source):
    """Return the lent HalfKernels where they take `out` and `source` (contiguous host numpy
    arrays of one half type, large enough, `source` writeable: a framework may refuse a
    read-only view, as torch warns), else None."""
    kernels = _half_kernels
    if (  # (asked on every reduction: the common case, another dtype, leaves at the second test)
        kernels is None
        or out.dtype not in _HALF_TYPES
        or type(out) is not np.ndarray
        or type(source) is not np.ndarray
        or out.size < _HALF_KERNEL_MIN_SIZE
        or source.dtype != out.dtype
        or not (out.flags.c_contiguous and source.flags.c_contiguous)
        or not source.flags.writeable
    ):
        return None
    return kernels
