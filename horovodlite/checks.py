"""Argument checks of the collectives, run before any communication.

An argument error found on one rank must fail on every rank, not only there: so the checks do
not raise at once; `checked()` returns the error for the collective's Plan to carry through the
agreement step, where every rank raises it (plan.py).
"""

import math
import numbers
import operator

import numpy as np

from .algorithms import ADASUM_DTYPES, is_power_of_two
from .buffers import array_module, as_array
from .ops import ReduceOp
from .process_sets import communicator, global_process_set

__all__ = [
    "check_adasum",
    "check_reduction",
    "check_writable",
    "check_rows",
    "check_gathered_rows",
    "parse_splits",
    "root_index",
    "checked",
    "prepare",
    "set_id",
]


def check_reduction(
    array, op: ReduceOp, prescale: float, postscale: float, size: int, what: str = "allreduce"
) -> None:
    """Raise if `op` with these scale factors cannot reduce `array` over `size` ranks in `what`."""
    if op == ReduceOp.ADASUM:
        check_adasum(array, size, what)
    for which, factor in (("prescale_factor", prescale), ("postscale_factor", postscale)):
        if type(factor) is float and math.isfinite(factor):
            continue  # the common case, without the slow isinstance of an ABC
        if not isinstance(factor, numbers.Real):
            raise TypeError(f"{which} must be a real number, got {type(factor).__name__}")
        if not math.isfinite(factor):
            raise ValueError(f"{which} must be a finite number, got {factor}")
    if array.dtype == np.bool_:
        if op == ReduceOp.AVERAGE:
            raise TypeError("Average of bool arrays is undefined: use Sum (or) or Min (and)")
        if prescale != 1.0 or postscale != 1.0:
            raise TypeError("bool arrays cannot be scaled: drop prescale/postscale_factor")


def check_adasum(array, size: int, what: str = "allreduce") -> None:
    """Raise if Adasum cannot reduce `array` over `size` ranks in the collective `what`."""
    if what != "allreduce":
        raise NotImplementedError(
            f"{what} does not support op=Adasum (nor does Horovod): use allreduce(op=Adasum), "
            "or op=Average or Sum"
        )
    if array.dtype not in ADASUM_DTYPES:
        raise TypeError(
            f"Adasum combines floating-point vectors, got dtype {array.dtype}: use float16, "
            "bfloat16, float32 or float64, or op=Sum"
        )
    if not is_power_of_two(size):
        raise ValueError(
            f"Adasum needs a power-of-two number of ranks (1, 2, 4, 8, ...), but the process "
            f"set has {size}: run on a power of two, reduce over a process set of that size, "
            "or use op=Average"
        )


def check_writable(array, what: str) -> None:
    """Raise if the in-place collective `what` cannot write into `array`."""
    if not getattr(array.flags, "writeable", True):
        raise ValueError(f"{what} writes into its input, but the array is read-only")


def check_rows(array, what: str) -> None:
    """Raise if `array` has no dimension 0 for the collective `what` to work on."""
    if array.ndim == 0:
        raise ValueError(f"{what} works on dimension 0, but got a 0-d array: reshape it to (1,)")


def check_gathered_rows(counts, rows: int) -> None:
    """Raise if the rows that the ranks hold (`counts`, agreed) do not fill allgather_into's
    `rows`: the same sums on every rank, so all raise alike."""
    if sum(counts) != rows:
        raise ValueError(
            f"allgather_into: the ranks hold {list(counts)} rows, {sum(counts)} in all, "
            f"but out has {rows}"
        )


def root_index(root_rank, ranks) -> int:
    """Return the position of global rank `root_rank` in the process set `ranks`."""
    try:
        root = operator.index(root_rank)
    except TypeError:
        raise TypeError(f"root_rank must be an int, got {type(root_rank).__name__}") from None
    if root not in ranks:
        raise ValueError(
            f"root_rank {root} is not a rank of this process set (ranks {list(ranks)})"
        )
    return list(ranks).index(root)


def checked(check, error=None):
    """Run `check()`; return (its result, None) or (None, the argument error it raised).

    An `error` found earlier (an input that is no supported array) is returned without checking.
    """
    if error is not None:
        return None, error
    try:
        return check(), None
    except (TypeError, ValueError, NotImplementedError) as exc:
        return None, exc


def prepare(tensor, process_set):
    """Return (communicator, global ranks, array, array module, input error) for a collective.

    An input that is no supported array must fail on every rank, not only here, so its
    TypeError is returned (with an empty stand-in array) for the plan to carry.
    """
    comm, ranks = communicator(process_set)
    try:
        array = as_array(tensor)
    except TypeError as exc:
        return comm, ranks, np.empty(0, dtype=np.uint8), np, exc
    return comm, ranks, array, array_module(array), None


def set_id(process_set) -> int:
    """Return the registry id of `process_set` (None means the global set)."""
    return (process_set or global_process_set).process_set_id


def parse_splits(splits, rows: int, size: int) -> np.ndarray:
    """Return alltoall()'s rows to send to each rank, or raise ValueError for bad `splits`."""
    if splits is None:
        if rows % size:
            raise ValueError(
                f"alltoall without splits divides dimension 0 evenly, but {rows} rows do not "
                f"divide by {size} ranks: pass splits="
            )
        return np.full(size, rows // size, dtype=np.int64)
    values = np.asarray(splits)
    if values.dtype.kind not in "iu" and values.size:
        # ValueError, as Horovod: a list of floats is a wrong value more than a wrong type.
        raise ValueError(f"splits must be integers, got dtype {values.dtype}")
    values = values.astype(np.int64).reshape(-1)
    if values.size != size:
        raise ValueError(f"splits has {values.size} entries, expected one per rank ({size})")
    if (values < 0).any():
        raise ValueError(f"splits must be non-negative, got {values.tolist()}")
    if values.sum() != rows:
        raise ValueError(
            f"splits {values.tolist()} add up to {values.sum()}, but dimension 0 has {rows} rows"
        )
    return values
