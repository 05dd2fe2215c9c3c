"""The collectives on numpy and GPU arrays.

Each collective is written once, as a `*_plan` function that validates the arguments and returns a
Plan (plan.py). The public synchronous names run the plan at once (`run_now`); the engine runs the
same plans asynchronously. Argument errors found on one rank travel with the plan and are raised
on every rank after the agreement step, so a mistake never leaves the other ranks waiting.
"""

import itertools
import math
import operator
from contextlib import nullcontext

import numpy as np
from mpi4py import MPI

from . import algorithms
from .agreement import digest, exchange_with_data, explain, inline_bytes, same_everywhere
from .algorithms.native import MPI_OPS
from .algorithms.scratch import chunk_bounds, scratch
from .buffers import (
    DTYPE_NAMES,
    array_module,
    as_array,
    cuda_aware_mpi,
    native_mpi_type,
    synchronize_device,
    wire_type,
)
from .ops import ReduceOp, resolve_op
from .plan import Plan, run_now
from .process_sets import communicator, global_process_set
from .state import current

__all__ = [
    "allreduce",
    "allreduce_",
    "grouped_allreduce",
    "broadcast",
    "broadcast_",
    "allgather",
    "reducescatter",
    "alltoall",
    "barrier",
    "broadcast_object",
    "allgather_object",
    "allreduce_plan",
    "broadcast_plan",
    "allgather_plan",
    "reducescatter_plan",
    "alltoall_plan",
    "fused_allreduce",
]


# ---------------------------------------------------------------------------------------------
# Working buffers: where an algorithm runs, and how its result gets back to the caller.


def _staged(xp) -> bool:
    """Return whether GPU data must go through host memory (the MPI is not CUDA-aware)."""
    return xp is not np and not cuda_aware_mpi()


def _flat_work(array, xp, copy: bool):
    """Return (flat contiguous buffer, its module) for an algorithm to run on."""
    if _staged(xp):
        return xp.asnumpy(array).reshape(-1), np
    if not copy and array.flags.c_contiguous:
        buf = array.reshape(-1)
    else:
        buf = xp.array(array, copy=True, order="C").reshape(-1)
    synchronize_device(xp)
    return buf, xp


def _deliver(buf, array, xp, inplace: bool, shape=None):
    """Hand `buf` back shaped as `shape`: as a new array, or written into `array` if in place."""
    out = buf.reshape(array.shape if shape is None else shape)
    if xp is not np and isinstance(out, np.ndarray):
        out = xp.asarray(out)
    if not inplace:
        return out
    if not _same_memory(out, array):
        array[...] = out
    return array


def _same_memory(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return np.shares_memory(a, b)
    return a.data.ptr == b.data.ptr


def _scale(xp, buf, factor: float) -> None:
    # Unsafe casting lets integer arrays scale in float64 and truncate toward zero, as Horovod.
    if factor != 1.0:
        xp.multiply(buf, factor, out=buf, casting="unsafe")


# ---------------------------------------------------------------------------------------------
# Argument checks. They run before any communication; an error is carried by the plan.


def _check_reduction(array, op: ReduceOp, prescale: float, postscale: float) -> None:
    if op == ReduceOp.ADASUM:
        raise NotImplementedError("Adasum is not implemented in horovodlite: use Average or Sum")
    if array.dtype == np.bool_:
        if op == ReduceOp.AVERAGE:
            raise TypeError("Average of bool arrays is undefined: use Sum (or) or Min (and)")
        if prescale != 1.0 or postscale != 1.0:
            raise TypeError("bool arrays cannot be scaled: drop prescale/postscale_factor")


def _check_writable(array, what: str) -> None:
    if not getattr(array.flags, "writeable", True):
        raise ValueError(f"{what} writes into its input, but the array is read-only")


def _check_rows(array, what: str) -> None:
    if array.ndim == 0:
        raise ValueError(f"{what} works on dimension 0, but got a 0-d array: reshape it to (1,)")


def _root_index(root_rank, ranks) -> int:
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


def _checked(check, error=None):
    """Run `check()`; return (its result, None) or (None, the argument error it raised).

    An `error` found earlier (an input that is no supported array) is returned without checking.
    """
    if error is not None:
        return None, error
    try:
        return check(), None
    except (TypeError, ValueError, NotImplementedError) as exc:
        return None, exc


def _prepare(tensor, process_set):
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


def _set_id(process_set) -> int:
    return (process_set or global_process_set).process_set_id


# ---------------------------------------------------------------------------------------------
# All-reduce, fusable.


class FusionEntry:
    """One all-reduce as the fusion code sees it: its input, and how to return its result."""

    def __init__(self, array, xp, inplace, op, prescale, postscale, requested):
        self.array, self.xp, self.inplace = array, xp, inplace
        self.op, self.prescale, self.postscale, self.requested = op, prescale, postscale, requested
        # All-reduces with equal keys can share one fusion buffer and one collective.
        self.key = (array.dtype, op, prescale, postscale, requested, xp.__name__)


def fused_allreduce(comm, entries: list, timeline=None) -> list:
    """All-reduce `entries` (equal keys) as one buffer; return their results in order.

    `timeline`, if given, is called as `timeline(phase)` and returns a context manager that
    records the phase (engine.py passes the Chrome-trace recorder).
    """
    span = timeline or (lambda phase: nullcontext())
    first = entries[0]
    dtype, xp = first.array.dtype, first.xp
    if len(entries) == 1:
        buf, module = _flat_work(first.array, xp, copy=not first.inplace)
    else:
        module = np if _staged(xp) else xp
        total = sum(entry.array.size for entry in entries)
        buf = scratch(module, dtype, total, slot="fusion")
        with span("MEMCPY_IN_FUSION_BUFFER"):
            offset = 0
            for entry in entries:
                part, _ = _flat_work(entry.array, xp, copy=False)
                buf[offset : offset + part.size] = part
                offset += part.size
        synchronize_device(module)
    chosen = algorithms.choose(first.requested, algorithms.ALLREDUCE, buf.nbytes, dtype, module)
    with span(f"ALLREDUCE_{chosen.upper()}"):
        _scale(module, buf, first.prescale)
        algorithms.ALLREDUCE[chosen](comm, buf, first.op, module)
        divisor = comm.size if first.op == ReduceOp.AVERAGE else 1
        _scale(module, buf, first.postscale / divisor)
    if len(entries) == 1:
        return [_deliver(buf, first.array, xp, first.inplace)]
    results, offset = [], 0
    with span("MEMCPY_OUT_FUSION_BUFFER"):
        for entry in entries:
            part = buf[offset : offset + entry.array.size]
            offset += entry.array.size
            # The fusion buffer is reused, so out-of-place results need their own memory.
            results.append(
                _deliver(part if entry.inplace else part.copy(), entry.array, xp, entry.inplace)
            )
    return results


def _allreduce_fields(name, array, op, prescale, postscale, requested, on_host: bool) -> dict:
    """Return what the ranks must agree on for an all-reduce (agreement.py)."""
    return {
        "collective": "allreduce",
        "name": name,
        "dtype": DTYPE_NAMES[array.dtype],
        "shape": tuple(array.shape),
        "op": getattr(op, "name", None),
        "prescale_factor": float(prescale),
        "postscale_factor": float(postscale),
        "algorithm": requested,
        "device": "cpu" if on_host else "cuda",
    }


def allreduce_plan(
    tensor,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
    inplace=False,
) -> Plan:
    """Return the Plan of an all-reduce; see allreduce() for the arguments."""
    comm, _, array, xp, bad_input = _prepare(tensor, process_set)
    state = current()

    def parse():
        resolved = resolve_op(op, average)
        _check_reduction(array, resolved, prescale_factor, postscale_factor)
        if inplace:
            _check_writable(array, "allreduce_")
        return resolved, algorithms.requested_algorithm(algorithm, state.allreduce_algorithm)

    parsed, error = _checked(parse, bad_input)
    resolved, requested = parsed or (None, None)
    fields = _allreduce_fields(
        name, array, resolved, prescale_factor, postscale_factor, requested, xp is np
    )
    entry = inline = None
    if error is None:
        entry = FusionEntry(
            array, xp, inplace, resolved, float(prescale_factor), float(postscale_factor), requested
        )
        scaled = prescale_factor != 1.0 or postscale_factor != 1.0
        if (
            xp is np
            and state.check_metadata
            and _travels_inline(array, resolved, scaled, requested, comm.size)
        ):

            def inline(comm):
                own = digest(fields)
                return _inline_allreduce(comm, own, array, resolved, inplace, lambda: fields)

    return Plan(
        fields,
        _set_id(process_set),
        comm,
        error,
        execute=lambda comm, _: fused_allreduce(comm, [entry])[0],
        fusion=entry,
        inline=inline,
    )


# A small all-reduce travels inside its own metadata check (agreement.exchange_with_data): every
# rank
# gathers every rank's tensor with the digests, checks them, and reduces locally in rank order,
# so all ranks compute bitwise the same result. One message instead of a check and then the
# all-reduce is what the tiny tensors that training loops average (losses, metrics) need.
# Whether an all-reduce goes this way depends only on what the digest covers and on the group
# size, so ranks that agree always take the same way; ranks that differ meet in the same
# exchange and raise.

_AVERAGE, _ADASUM = ReduceOp.AVERAGE, ReduceOp.ADASUM  # an Enum's class attribute costs 0.1 µs
_UFUNCS = {
    ReduceOp.AVERAGE: np.add,
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def _travels_inline(array, op, scaled: bool, requested, size: int) -> bool:
    """Return whether a checked all-reduce of host `array` rides in the metadata check.

    The one rule for both the short and the general path: it reads only what the digest covers
    and the group size, so every rank decides alike.
    """
    return (
        requested is None
        and not scaled
        and op in _UFUNCS
        and array.nbytes <= inline_bytes(size)
        and native_mpi_type(array.dtype) is not None
    )


def _inline_allreduce(comm, own: int, array, op, inplace: bool, fields):
    """All-reduce `array` in the check's records; `fields()` explains a mismatch."""
    rows = exchange_with_data(comm, own, array)
    if rows is None:
        explain(comm, fields())
    # Rank by rank, so every rank adds in the same order and gets the same bits. (A pairwise
    # ufunc on cached rows is three times faster here than ufunc.reduce over a 2-D view.)
    ufunc = _UFUNCS[op]
    out = ufunc(rows[0], rows[1]) if len(rows) > 1 else rows[0].copy()
    for row in rows[2:]:
        ufunc(out, row, out=out)
    if op is _AVERAGE:
        _scale(np, out, 1.0 / comm.size)
    if inplace:
        return _deliver(out, array, np, inplace)
    return out if array.ndim == 1 else out.reshape(array.shape)


# The short way for small host arrays. A small all-reduce is bound by latency: building a Plan,
# its closures and a working copy cost more than MPICH's whole all-reduce (docs/benchmarks.md).
# This path makes the same check (the digest of the same fields, so ranks on either path match)
# and the same MPI call as the general one, with as little Python as possible.

# (name, dtype, shape, op, algorithm, group size) -> (digest, MPI type, travels inline)
_short_routes: dict = {}


def _short_route(tensor, op, name, requested, size: int):
    """Return (digest, MPI datatype, whether it travels inline) for a short all-reduce.

    The datatype is None where the MPI library cannot reduce this dtype itself (float16,
    bfloat16, bool, unsupported ones): those go the general way, which also reports errors.
    """
    mpi_type = native_mpi_type(tensor.dtype)
    if mpi_type is None:
        return None, None, False
    fields = _allreduce_fields(name, tensor, op, 1.0, 1.0, requested, True)
    return digest(fields), mpi_type, _travels_inline(tensor, op, False, requested, size)


def _short_allreduce(tensor, op, name, scaled: bool, process_set, algorithm, inplace: bool):
    """All-reduce a small contiguous numpy array on all ranks; return None to go the general way.

    `scaled` is whether a prescale/postscale factor other than 1 or `average=` was given.
    """
    if (
        type(tensor) is not np.ndarray
        or scaled
        or process_set is not global_process_set
        or tensor.nbytes > algorithms.SMALL_MESSAGE_BYTES
        or not tensor.flags.c_contiguous
        or (inplace and not tensor.flags.writeable)
    ):
        return None
    state = current()
    requested = state.allreduce_algorithm if algorithm is None else algorithm
    if requested not in (None, "mpi"):
        return None
    if op is None:
        op = _AVERAGE
    elif type(op) is not ReduceOp or op is _ADASUM:
        return None
    comm = state.comm
    key = (name, tensor.dtype, tensor.shape, op, requested, comm.size)
    route = _short_routes.get(key)
    if route is None:
        if len(_short_routes) > 4096:  # names that change every step
            _short_routes.clear()
        route = _short_routes[key] = _short_route(tensor, op, name, requested, comm.size)
    own, mpi_type, inline = route
    if mpi_type is None:
        return None
    if state.check_metadata:
        if inline:
            return _inline_allreduce(
                comm,
                own,
                tensor,
                op,
                inplace,
                lambda: _allreduce_fields(name, tensor, op, 1.0, 1.0, requested, True),
            )
        if not same_everywhere(comm, own):
            explain(comm, _allreduce_fields(name, tensor, op, 1.0, 1.0, requested, True))
    out = tensor if inplace else np.empty_like(tensor)
    send = MPI.IN_PLACE if inplace else [tensor, mpi_type]
    comm.Allreduce(send, [out, mpi_type], MPI_OPS[op])
    if op is _AVERAGE:
        _scale(np, out, 1.0 / comm.size)
    return out


def allreduce(
    tensor,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
):
    """Return the reduction of `tensor` over all ranks of the process set.

    Args:
        tensor: a numpy array, a CuPy array, or any array with the buffer protocol,
            `__cuda_array_interface__` or DLPack. Same shape and dtype on every rank.
        op: Average (default), Sum, Min, Max or Product. Average of integers truncates.
        name: a name for error messages (and, in async use, for matching across ranks).
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result (after Average's division).
        process_set: the ranks taking part; default all.
        algorithm: "ring", "naive", "mpi", or None to choose by message size
            (HOROVODLITE_ALLREDUCE_ALGORITHM sets the default).
        average: deprecated; True means op=Average, False op=Sum.

    Raises:
        TypeError, ValueError: bad arguments on this rank (raised on every rank).
        HorovodLiteError: the ranks' arguments disagree, or another rank's were bad.
    """
    scaled = prescale_factor != 1.0 or postscale_factor != 1.0 or average is not None
    out = _short_allreduce(tensor, op, name, scaled, process_set, algorithm, inplace=False)
    if out is not None:
        return out
    return run_now(
        allreduce_plan(
            tensor, op, name, prescale_factor, postscale_factor, process_set, algorithm, average
        )
    )


def allreduce_(
    tensor,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
):
    """In-place allreduce(): write the result into `tensor` and return it."""
    scaled = prescale_factor != 1.0 or postscale_factor != 1.0 or average is not None
    out = _short_allreduce(tensor, op, name, scaled, process_set, algorithm, inplace=True)
    if out is not None:
        return out
    return run_now(
        allreduce_plan(
            tensor,
            op,
            name,
            prescale_factor,
            postscale_factor,
            process_set,
            algorithm,
            average,
            inplace=True,
        )
    )


def grouped_allreduce(
    tensors,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
    inplace=False,
) -> list:
    """All-reduce a list of arrays of one dtype as one fused buffer; return the results.

    `name` names the group; the arrays are named "<name>.0", "<name>.1", ... in errors.
    """
    prefix = name if name is not None else "grouped_allreduce"
    plans = [
        allreduce_plan(
            t,
            op,
            f"{prefix}.{i}",
            prescale_factor,
            postscale_factor,
            process_set,
            algorithm,
            average,
            inplace,
        )
        for i, t in enumerate(tensors)
    ]
    if not plans:
        return []
    error = next((p.error for p in plans if p.error is not None), None)
    if error is None and len({p.fusion.key for p in plans}) > 1:
        error = TypeError("grouped_allreduce needs arrays of one dtype and one kind of device")
    fields = {
        "collective": "grouped_allreduce",
        "name": name,
        "members": tuple(tuple(sorted(p.fields.items())) for p in plans),
    }
    group = Plan(
        fields,
        plans[0].process_set_id,
        plans[0].comm,
        error,
        execute=lambda comm, _: fused_allreduce(comm, [p.fusion for p in plans]),
    )
    return run_now(group)


# ---------------------------------------------------------------------------------------------
# Reduce-scatter.


def reducescatter_plan(
    tensor,
    op=ReduceOp.AVERAGE,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
) -> Plan:
    """Return the Plan of a reduce-scatter; see reducescatter() for the arguments."""
    comm, _, array, xp, bad_input = _prepare(tensor, process_set)

    def parse():
        resolved = resolve_op(op, None)
        _check_rows(array, "reducescatter")
        _check_reduction(array, resolved, prescale_factor, postscale_factor)
        requested = algorithms.requested_algorithm(algorithm, current().allreduce_algorithm)
        if requested not in (None, *algorithms.REDUCESCATTER):
            raise ValueError(
                f"reducescatter has no {requested!r} algorithm: use "
                f"{', '.join(algorithms.REDUCESCATTER)} or None"
            )
        return resolved, requested

    parsed, error = _checked(parse, bad_input)
    resolved, requested = parsed or (None, None)
    fields = {
        "collective": "reducescatter",
        "name": name,
        "dtype": DTYPE_NAMES[array.dtype],
        "shape": tuple(array.shape),
        "op": getattr(resolved, "name", None),
        "prescale_factor": float(prescale_factor),
        "postscale_factor": float(postscale_factor),
        "algorithm": requested,
    }

    def execute(comm, _):
        buf, module = _flat_work(array, xp, copy=True)
        row = math.prod(array.shape[1:])
        rows = chunk_bounds(array.shape[0], comm.size)
        bounds = tuple((lo * row, hi * row) for lo, hi in rows)
        chosen = algorithms.choose(
            requested, algorithms.REDUCESCATTER, buf.nbytes, buf.dtype, module
        )
        _scale(module, buf, prescale_factor)
        mine = algorithms.REDUCESCATTER[chosen](comm, buf, bounds, resolved, module).copy()
        divisor = comm.size if resolved == ReduceOp.AVERAGE else 1
        _scale(module, mine, postscale_factor / divisor)
        lo, hi = rows[comm.rank]
        return _deliver(mine, array, xp, False, (hi - lo, *array.shape[1:]))

    return Plan(fields, _set_id(process_set), comm, error, execute=execute)


def reducescatter(
    tensor,
    op=ReduceOp.AVERAGE,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
):
    """Reduce `tensor` over the ranks and return this rank's slice of dimension 0.

    Rows are split as Horovod does: with n rows and k ranks, ranks 0 .. n % k - 1 get
    n // k + 1 rows and the others n // k. `algorithm` is "ring", "mpi" or None.
    """
    return run_now(
        reducescatter_plan(
            tensor, op, name, prescale_factor, postscale_factor, process_set, algorithm
        )
    )


# ---------------------------------------------------------------------------------------------
# Data movement.


def broadcast_plan(
    tensor, root_rank, name=None, process_set=global_process_set, inplace=False
) -> Plan:
    """Return the Plan of a broadcast; see broadcast() for the arguments."""
    comm, ranks, array, xp, bad_input = _prepare(tensor, process_set)

    def parse():
        if inplace:
            _check_writable(array, "broadcast_")
        return _root_index(root_rank, ranks)

    root, error = _checked(parse, bad_input)
    fields = {
        "collective": "broadcast",
        "name": name,
        "dtype": DTYPE_NAMES[array.dtype],
        "shape": tuple(array.shape),
        "root_rank": root_rank,
    }

    def execute(comm, _):
        buf, _module = _flat_work(array, xp, copy=not inplace)
        comm.Bcast([buf, wire_type(buf.dtype)], root)
        return _deliver(buf, array, xp, inplace)

    return Plan(fields, _set_id(process_set), comm, error, execute=execute)


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Return a copy of `tensor` as held by global rank `root_rank`, on every rank."""
    return run_now(broadcast_plan(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast(): overwrite `tensor` with the root's and return it."""
    return run_now(broadcast_plan(tensor, root_rank, name, process_set, inplace=True))


def _displacements(counts: list) -> list:
    return [0, *itertools.accumulate(counts[:-1])]


def allgather_plan(tensor, name=None, process_set=global_process_set) -> Plan:
    """Return the Plan of an allgather; see allgather() for the arguments."""
    comm, _, array, xp, bad_input = _prepare(tensor, process_set)
    _, error = _checked(lambda: _check_rows(array, "allgather"), bad_input)
    fields = {
        "collective": "allgather",
        "name": name,
        "dtype": DTYPE_NAMES[array.dtype],
        "trailing_shape": tuple(array.shape[1:]),
    }

    def execute(comm, rows):
        buf, module = _flat_work(array, xp, copy=False)
        row = math.prod(array.shape[1:])
        counts = [r * row for r in rows]
        out = module.empty(sum(counts), dtype=array.dtype)
        wire = wire_type(array.dtype)
        comm.Allgatherv([buf, wire], [out, (counts, _displacements(counts)), wire])
        return _deliver(out, array, xp, False, (sum(rows), *array.shape[1:]))

    payload = array.shape[0] if array.ndim else 0
    return Plan(fields, _set_id(process_set), comm, error, payload=payload, execute=execute)


def allgather(tensor, name=None, process_set=global_process_set):
    """Return every rank's `tensor` concatenated along dimension 0, in rank order.

    Dimension 0 may differ between ranks; the other dimensions and the dtype must match.
    """
    return run_now(allgather_plan(tensor, name, process_set))


def _parse_splits(splits, rows: int, size: int) -> np.ndarray:
    if splits is None:
        if rows % size:
            raise ValueError(
                f"alltoall without splits divides dimension 0 evenly, but {rows} rows do not "
                f"divide by {size} ranks: pass splits="
            )
        return np.full(size, rows // size, dtype=np.int64)
    values = np.asarray(splits)
    if values.dtype.kind not in "iu" and values.size:
        raise TypeError(f"splits must be integers, got dtype {values.dtype}")
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


def alltoall_plan(tensor, splits=None, name=None, process_set=global_process_set) -> Plan:
    """Return the Plan of an alltoall; see alltoall() for the arguments."""
    comm, _, array, xp, bad_input = _prepare(tensor, process_set)

    def parse():
        _check_rows(array, "alltoall")
        return _parse_splits(splits, array.shape[0], comm.size)

    send_splits, error = _checked(parse, bad_input)
    fields = {
        "collective": "alltoall",
        "name": name,
        "dtype": DTYPE_NAMES[array.dtype],
        "trailing_shape": tuple(array.shape[1:]),
        "splits_given": splits is not None,
    }

    def execute(comm, _):
        received_splits = np.empty(comm.size, dtype=np.int64)
        comm.Alltoall(send_splits, received_splits)
        buf, module = _flat_work(array, xp, copy=False)
        row = math.prod(array.shape[1:])
        send_counts, recv_counts = (send_splits * row).tolist(), (received_splits * row).tolist()
        out = module.empty(int(received_splits.sum()) * row, dtype=array.dtype)
        wire = wire_type(array.dtype)
        comm.Alltoallv(
            [buf, (send_counts, _displacements(send_counts)), wire],
            [out, (recv_counts, _displacements(recv_counts)), wire],
        )
        received = _deliver(out, array, xp, False, (int(received_splits.sum()), *array.shape[1:]))
        if splits is None:
            return received
        return received, received_splits.astype(np.int32)

    return Plan(fields, _set_id(process_set), comm, error, execute=execute)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send rows `splits[i]` of `tensor`'s dimension 0 to rank i; return what arrives, in order.

    Without `splits` dimension 0 is split evenly and must divide by the number of ranks.

    Returns:
        The received array, or `(received, received_splits)` when `splits` was given.
    """
    return run_now(alltoall_plan(tensor, splits, name, process_set))


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank of the process set reaches this call."""
    comm, _ = communicator(process_set)
    run_now(
        Plan(
            {"collective": "barrier"},
            _set_id(process_set),
            comm,
            execute=lambda comm, _: comm.Barrier(),
        )
    )


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Return the picklable `obj` of global rank `root_rank`, on every rank."""
    comm, ranks = communicator(process_set)
    root, error = _checked(lambda: _root_index(root_rank, ranks))
    fields = {"collective": "broadcast_object", "name": name, "root_rank": root_rank}
    return run_now(
        Plan(
            fields,
            _set_id(process_set),
            comm,
            error,
            execute=lambda comm, _: comm.bcast(obj, root=root),
        )
    )


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Return the list of every rank's picklable `obj`, in rank order."""
    comm, _ = communicator(process_set)
    fields = {"collective": "allgather_object", "name": name}
    return run_now(
        Plan(fields, _set_id(process_set), comm, execute=lambda comm, _: comm.allgather(obj))
    )
