"""The short ways for all-reduces: inside the metadata check, or straight to the transport.

A small all-reduce is bound by latency: building a Plan, its closures and a working copy cost
more than MPICH's whole all-reduce (docs/benchmarks.md). Two things keep it cheap:

- **Inline.** A tensor that fits in the check's records travels inside its own metadata check
  (agreement.exchange_with_data): every rank gathers every rank's tensor with the digests,
  checks them, and reduces locally in rank order, so all ranks compute bitwise the same result.
  One message instead of a check and then the all-reduce is what the tiny tensors that training
  loops average (losses, metrics) need.
- **Short path.** `short_allreduce` makes the same check as the general path (the digest of the
  same fields, so ranks on either path match) and the same call, with as little Python as
  possible: MPI's own all-reduce for a small host array, or the transport's all-reduce where
  another transport moves the array (gloo for host arrays where HOROVODLITE_TRANSPORT names it,
  NCCL for GPU arrays), at any size, reading the input apart from the new result. The CPU twin
  (gloo) runs the very lines a GPU array on NCCL runs (docs/gpu.md).
- **A framework's tensor as it is.** `tensor_allreduce` is the short path for a tensor that its
  transport moves without a numpy or CuPy view (torch's on torch's gloo and NCCL groups), told
  how to handle it by the binding's `TensorKind`: the same check, then the framework's own
  all-reduce on the tensor itself (`TensorKind.allreduce`).

Whether an all-reduce travels inline depends only on what the digest covers and on the group
size (`travels_inline`, the one rule for both paths), so ranks that agree always take the same
way, and ranks that differ meet in the same exchange and raise.
"""

import math
import sys

import numpy as np
from mpi4py import MPI

from . import algorithms
from .agreement import digest, exchange_with_data, explain, inline_bytes, same_everywhere
from .algorithms.native import MPI_OPS
from .buffers import is_cupy_array, native_mpi_type
from .fusion import (
    FusionEntry,
    TensorEntry,
    allreduce_fields,
    fused_allreduce,
    fusion_key,
    reduce_tensor,
)
from .ops import ReduceOp, combined_as, result_factor
from .plan import templates, waiter
from .process_sets import global_process_set
from .result_memory import new_host_like
from .staging import deliver, scale
from .state import current
from .tensor_kind import Described, TensorKind
from .transport import ON_DEVICE, select

__all__ = [
    "travels_inline",
    "inline_allreduce",
    "short_allreduce",
    "tensor_allreduce",
    "tensors_taken",
]

# Bound once: reading an Enum's class attribute costs a noticeable part of this path's budget
# (docs/benchmarks.md, "Figures behind the code's constants").
_AVERAGE, _ADASUM = ReduceOp.AVERAGE, ReduceOp.ADASUM
_UFUNCS = {  # (Average combines as a Sum: ops.combined_as)
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


def travels_inline(array, op, scaled: bool, requested, size: int) -> bool:
    """Return whether a checked all-reduce of host `array` rides in the metadata check.

    The one rule for both the short and the general path: it reads only what the digest covers
    and the group size, so every rank decides alike.
    """
    return (
        requested is None
        and not scaled
        and combined_as(op) in _UFUNCS
        and array.nbytes <= inline_bytes(size)
        and native_mpi_type(array.dtype) is not None
    )


def inline_allreduce(comm, own: int, array, op, inplace: bool, fields, ranks, wait):
    """All-reduce `array` in the check's records; `fields()` explains a mismatch.

    `ranks` are the global ranks of `comm`'s members, for that explanation; `wait(request)`
    waits for the exchange.
    """
    rows = exchange_with_data(comm, own, array, wait)
    if rows is None:
        explain(comm, fields(), ranks=ranks)  # raises, or returns beside joined ranks
        return _beside_joined(comm, array, np, op, inplace, None)
    # Rank by rank, so every rank adds in the same order and gets the same bits; pairwise ufuncs
    # on the cached rows, as ufunc.reduce over a 2-D view costs more at these sizes (same doc).
    ufunc = _UFUNCS[combined_as(op)]
    out = ufunc(rows[0], rows[1]) if len(rows) > 1 else rows[0].copy()
    for row in rows[2:]:
        ufunc(out, row, out=out)
    scale(np, out, result_factor(op, 1.0, comm.size))
    if inplace:
        return deliver(out, array, np, inplace)
    return out if array.ndim == 1 else out.reshape(array.shape)


def _beside_joined(comm, array, xp, op, inplace: bool, requested):
    """All-reduce `array` the general way, as ranks in join() do with their zeros."""
    entry = FusionEntry(array, xp, inplace, op, 1.0, 1.0, requested)
    return fused_allreduce(comm, [entry])[0]


# Tags that start this module's keys in plan.templates' memo (kept per Settings object, as a route
# follows from the transport the settings choose): a short route, a framework tensor's route
# ("no route" too), and whether a transport here takes a kind of tensor on a device at all.
_SHORT, _TENSOR, _TAKEN = "short route", "tensor route", "tensor taken"


def _short_route(tensor, xp, op, name, requested, state):
    """Return (digest, MPI datatype, transport, whether it travels inline, wait) for a short
    all-reduce of `tensor`, an array of `xp`.

    On the host MPI's own all-reduce moves it (the datatype), unless HOROVODLITE_TRANSPORT names
    another transport for host data (gloo); a GPU array takes the transport that carries GPU
    buffers (NCCL). That transport then moves it, and the datatype is None. Both are None where
    neither can take the short way: a GPU array that MPI would move (through host memory, or a
    CUDA-aware MPI), a dtype the MPI library cannot reduce itself (float16, bfloat16, bool):
    those go the general way, as do errors.
    """
    transport = select(state.settings, xp, op, tensor.dtype)
    on_host = xp is np
    mpi_type = None
    if transport.name == "mpi":
        mpi_type, transport = native_mpi_type(tensor.dtype) if on_host else None, None
        if mpi_type is None:
            return None, None, None, False, None
    size = state.comm.size
    fields = allreduce_fields(name, tensor, op, 1.0, 1.0, requested, on_host)
    inline = mpi_type is not None and travels_inline(tensor, op, False, requested, size)
    return digest(fields), mpi_type, transport, inline, waiter(state, fields, range(size))


# allreduce()'s options; an unknown one goes the general way, which raises the TypeError.
_OPTIONS = frozenset(
    {"op", "name", "prescale_factor", "postscale_factor", "process_set", "algorithm", "average"}
    | {"inplace"}
)


def _plain(options: dict):
    """Return (op, requested algorithm, state) where allreduce()'s keyword arguments `options`
    may take a short way, else None: scaling, `average=`, a process set, Adasum, an algorithm
    other than MPI's or an unknown argument go the general way, which checks and reports them."""
    get = options.get
    if (
        get("process_set", global_process_set) is not global_process_set
        or get("prescale_factor", 1.0) != 1.0
        or get("postscale_factor", 1.0) != 1.0
        or get("average") is not None
        or not _OPTIONS.issuperset(options)
    ):
        return None
    op, algorithm = get("op"), get("algorithm")
    state = current()
    requested = state.settings.allreduce_algorithm if algorithm is None else algorithm
    if requested not in (None, "mpi"):
        return None
    if op is None:
        op = _AVERAGE
    elif type(op) is not ReduceOp or op is _ADASUM:
        return None
    return op, requested, state


def short_allreduce(tensor, options: dict):
    """All-reduce a contiguous array on all ranks; return None to go the general way.

    `options` are allreduce()'s keyword arguments (`_plain` says which go the general way), as
    does a host array past SMALL_MESSAGE_BYTES that MPI moves (MPI's own all-reduce is not the
    algorithm chosen there).
    """
    xp = _module_of(tensor)
    if xp is None or not tensor.flags.c_contiguous:
        return None
    plain = _plain(options)
    if plain is None:
        return None
    op, requested, state = plain
    name, inplace = options.get("name"), options.get("inplace", False)
    if inplace and not getattr(tensor.flags, "writeable", True):  # (CuPy's always are)
        return None
    comm = state.comm
    memo = templates(state.settings)
    key = (_SHORT, name, xp, tensor.dtype, tensor.shape, op, requested, state)
    route = memo.get(key)
    if route is None:
        route = memo[key] = _short_route(tensor, xp, op, name, requested, state)
    own, mpi_type, transport, inline, wait = route
    if transport is None and (mpi_type is None or tensor.nbytes > algorithms.SMALL_MESSAGE_BYTES):
        return None
    if state.settings.check_metadata:
        if inline:
            return inline_allreduce(
                comm,
                own,
                tensor,
                op,
                inplace,
                lambda: allreduce_fields(name, tensor, op, 1.0, 1.0, requested, True),
                None,
                wait,
            )
        if not same_everywhere(comm, own, wait):
            explain(comm, allreduce_fields(name, tensor, op, 1.0, 1.0, requested, xp is np))
            return _beside_joined(comm, tensor, xp, op, inplace, requested)
    out = tensor if inplace else new_host_like(tensor) if xp is np else xp.empty_like(tensor)
    if transport is not None:  # (it reads `tensor` apart from `out`, or copies it there first)
        source = None if inplace else tensor.reshape(-1)
        transport.allreduce(comm, out.reshape(-1), combined_as(op), xp, transport.name, None,
                            source)  # fmt: skip
    else:
        send = MPI.IN_PLACE if inplace else [tensor, mpi_type]
        comm.Allreduce(send, [out, mpi_type], MPI_OPS[combined_as(op)])
    scale(xp, out, result_factor(op, 1.0, comm.size))
    return out


_NO_ROUTE = ()


def tensor_allreduce(tensor, kind: TensorKind, name, inplace: bool, options: dict):
    """All-reduce a framework's `tensor` as it is, on the global set; return None to go the way
    of numpy and CuPy arrays. `options` are allreduce()'s other keyword arguments.

    The same check as every other way (the digest of the same fields) and the same transport
    call as `short_allreduce`'s, on the tensor itself: no view of it, and no DLPack round trip,
    where its transport moves such tensors (torch's gloo and NCCL). Scaling beyond Average on
    float32 and float64, and what `_plain` refuses, go the other way.
    """
    settings, device = current().settings, tensor.device
    memo = templates(settings)
    if not tensors_taken(tensor, kind, memo, settings):
        return None
    plain = _plain(options)
    if plain is None:
        return None
    op, requested, state = plain
    key = (_TENSOR, name, kind, tensor.dtype, tensor.shape, device, op, requested, state)
    route = memo.get(key)
    if route is None:
        route = memo[key] = _tensor_route(tensor, kind, op, name, requested, state) or _NO_ROUTE
    if route is _NO_ROUTE or not kind.contiguous(tensor):
        return None
    own, transport, wait, moves, combined, factor = route
    comm = state.comm
    # (Made before the check, which then leads straight to the transfer.)
    out = tensor if inplace else kind.empty_like(tensor)
    if state.settings.check_metadata and not same_everywhere(comm, own, wait):
        dtype, shape, on_host = kind.describe(tensor)
        explain(comm, allreduce_fields(name, Described(dtype, shape), op, 1.0, 1.0, requested,
                                       on_host))  # fmt: skip
        # Beside a joined rank (explain raises otherwise): the tensor goes as it is, as one the
        # engine moves, where the joined rank's zeros meet it (fusion.zeros_entry).
        xp = np if on_host else ON_DEVICE
        key = fusion_key(dtype, op, 1.0, 1.0, requested, xp)
        entry = TensorEntry(tensor, kind, dtype, xp, inplace, op, 1.0, 1.0, requested, key)
        return fused_allreduce(comm, [entry])[0]
    source = None if inplace else tensor
    return reduce_tensor(kind, transport, comm, out, source, combined, moves, factor)


def tensors_taken(tensor, kind: TensorKind, memo: dict, settings) -> bool:
    """Return whether any transport here takes tensors like `tensor` as they are; `memo` is
    plan.templates(settings). Asked first on every framework tensor's all-reduce: most never go
    as they are (torch's host tensors go to MPI unless HOROVODLITE_TRANSPORT=gloo) and pay no
    more than this look-up."""
    key = (_TAKEN, kind, tensor.device)
    taken = memo.get(key)
    if taken is None:
        taken = memo[key] = _ever_taken(tensor, kind, settings)
    return taken


def _ever_taken(tensor, kind, settings) -> bool:
    """Return whether the transport that moves data like `tensor` takes it as it is (the one
    select() gives for moving data only: a reduction it cannot run goes elsewhere)."""
    described = kind.describe(tensor)
    if described is None:
        return False
    return kind.carried_by(select(settings, np if described[2] else ON_DEVICE))


def _tensor_route(tensor, kind, op, name, requested, state):
    """Return (digest, transport, wait, whether data moves, the op it combines as, the result
    factor) for `tensor_allreduce`, or None where its transport does not move such tensors or
    the kind cannot scale the result."""
    described = kind.describe(tensor)
    if described is None:
        return None
    dtype, shape, on_host = described
    xp = np if on_host else ON_DEVICE
    transport = select(state.settings, xp, op, dtype)
    if not kind.carried_by(transport):
        return None
    size = state.comm.size
    factor = result_factor(op, 1.0, size)
    if factor != 1.0 and not kind.scales_alike(dtype):
        return None  # (integers truncate through float64 in scale(): no framework's multiply)
    fields = allreduce_fields(name, Described(dtype, shape), op, 1.0, 1.0, requested, on_host)
    moves = size > 1 and math.prod(shape) > 0
    wait = waiter(state, fields, range(size))
    return digest(fields), transport, wait, moves, combined_as(op), factor


def _module_of(tensor):
    """Return numpy or CuPy for an array of theirs (CuPy only if imported), else None."""
    if type(tensor) is np.ndarray:
        return np
    return sys.modules["cupy"] if is_cupy_array(tensor) else None
