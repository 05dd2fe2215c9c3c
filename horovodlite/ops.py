"""Reduce operations, the deprecated `average=` argument, and local reduction kernels."""

import enum
import warnings

__all__ = ["ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum", "resolve_op"]


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

# The elementwise kernel that combines two contributions. Average reduces as a sum and is
# divided afterwards, once, so every algorithm rounds the same way.
_UFUNC_NAME = {
    ReduceOp.AVERAGE: "add",
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
