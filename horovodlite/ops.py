"""Reduce operations, the deprecated `average=` argument, and local reduction kernels."""

import enum
import warnings

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
    getattr(xp, _UFUNC_NAME[op])(acc, incoming, out=acc)
