"""The plans of a framework's tensors that travel as they are: no numpy or CuPy view.

Where a binding's transport moves its tensors itself (torch's on torch.distributed's gloo and
NCCL groups), the core hands the tensors to it as they are.

- **All-reduce.** The engine joins a batch into one buffer of the framework's, moves it, and
  splits it back by the binding's `TensorKind` (tensor_kind.py; fusion.TensorEntry). The plan is
  the general way's own: its fields, checks and fusion key are derived once from the plan of the
  tensor's view (collectives.allreduce_plan) and kept as a template, so ranks on either way
  agree, fuse and reduce alike.
- **Broadcast, all-gather (also into a tensor in place), all-to-all and reduce-scatter.** The
  same fields as the general way's plans (collectives.py), and the same calls of the same
  transport (transport.GroupTransport, which views and makes the framework's tensors through
  the transport's own hooks), so ranks on either way meet; the tensor itself is moved, and
  results are the framework's tensors.
"""

import math
from typing import Optional

import numpy as np

from . import small_allreduce
from .agreement import array_fields
from .algorithms.scratch import chunk_bounds
from .checks import check_gathered_rows, parse_splits, root_index, set_id
from .collectives import (
    allreduce_plan,
    check_gather_into,
    received_splits_of,
    reducescatter_arguments,
    template_key,
)
from .fusion import TensorEntry, allreduce_fields, fusion_key
from .ops import ReduceOp, combined_as, result_factor
from .plan import Plan, run_now, templates
from .process_sets import communicator, global_process_set
from .state import current
from .tensor_kind import Described
from .transport import ON_DEVICE, select

__all__ = [
    "tensor_allreduce_now",
    "tensor_allreduce_plan",
    "tensor_broadcast_plan",
    "tensor_allgather_plan",
    "tensor_allgather_into_plan",
    "tensor_alltoall_plan",
    "tensor_reducescatter_plan",
]

_OPTIONS = frozenset({"op", "prescale_factor", "postscale_factor", "process_set", "algorithm"})


def tensor_allreduce_plan(tensor, kind, name, inplace: bool, options: dict) -> Optional[Plan]:
    """Return allreduce_plan() of a framework's `tensor` that the engine hands to its transport
    as it is, no numpy or CuPy view made (fusion.TensorEntry; `kind` is the binding's
    tensor_kind.TensorKind; `options` allreduce_async()'s other keyword arguments, less the
    deprecated `average`); or None, and the tensor goes as a view: where no transport here takes
    such tensors, the kind cannot join it (TensorKind.joinable: a strided slice, say), an option
    is unknown or no plain value, its transport would not move it (an op or dtype it cannot
    reduce), the result is scaled in a dtype the kind does not scale as the general way
    (integers, half types), or an argument is bad (the view's plan reports it on every rank).

    The asynchronous all-reduce's way for torch's tensors on gloo and NCCL, every gradient of
    every step: what follows from the arguments is derived once from the view's plan and kept
    as a template like any plan's, so a repeated call costs one look-up, the layout's test and
    the two objects it returns. A tensor that goes as a view (MPI's transport, the default) pays
    the same look-up, which says so.
    """
    get = options.get
    op, algorithm = get("op"), get("algorithm")
    prescale_factor, postscale_factor = get("prescale_factor", 1.0), get("postscale_factor", 1.0)
    process_set = get("process_set", global_process_set)
    state = current()
    # The process set itself stands for its size in the key: a set's ranks never change, and the
    # state in the key keeps the global set's communicator, kept in the template, to this job.
    key = template_key(name, op, prescale_factor, postscale_factor, algorithm, inplace,
                       process_set, tensor, kind)  # fmt: skip
    if key is None or not _OPTIONS.issuperset(options):
        return None
    key = (_TENSOR, key, tensor.device, state)
    memo = templates(state.settings)
    template = memo.get(key)
    if template is None:
        template = memo[key] = _tensor_template(
            tensor, kind, op, name, prescale_factor, postscale_factor, process_set, algorithm,
            inplace, state.settings,
        ) or _AS_VIEW  # fmt: skip
    if template is _AS_VIEW or not kind.joinable(tensor):
        return None
    resolved, requested, fields, fusion, dtype, xp, comm, ranks = template
    if comm is None:  # another set than the global one: looked up on every call, as it may go
        comm, ranks = communicator(process_set)
    entry = TensorEntry(tensor, kind, dtype, xp, inplace, resolved, prescale_factor,
                        postscale_factor, requested, fusion)  # fmt: skip
    return Plan(fields, set_id(process_set), comm, ranks, None, None, entry, entry, None)


def tensor_allreduce_now(tensor, kind, name, inplace: bool, options: dict):
    """allreduce() of a framework's `tensor` as it is, at once: for what the short way
    (small_allreduce.tensor_allreduce) leaves, a factor, a process set or a layout other than the
    contiguous one (channels_last); None where it goes as a view (see tensor_allreduce_plan).
    The engine's tensor way, run on the caller's thread: a GPU tensor whose view would be staged
    through host memory stays on its GPU."""
    plan = tensor_allreduce_plan(tensor, kind, name, inplace, options)
    return None if plan is None else run_now(plan)


_TENSOR, _AS_VIEW = "tensor plan", ()  # a framework tensor's template, and "goes as a view"


def _tensor_template(tensor, kind, op, name, prescale, postscale, process_set, algorithm,
                     inplace: bool, settings):  # fmt: skip
    """Return (op, requested algorithm, fields, fusion key, numpy dtype, module, communicator,
    global ranks) of a framework tensor's all-reduce (see tensor_allreduce_plan), or None where
    it goes as a view; the communicator and ranks are None for a set other than the global one.

    Built from the plan of its view, so the fields, the checks and the fusion key are the
    general way's own: ranks on either way agree, fuse and reduce alike.
    """
    if not small_allreduce.tensors_taken(tensor, kind, templates(settings), settings):
        return None
    described = kind.describe(tensor)
    if described is None:
        return None
    dtype, _, on_host = described
    plan = allreduce_plan(kind.to_core(tensor), op=op, name=name, prescale_factor=prescale,
                          postscale_factor=postscale, process_set=process_set,
                          algorithm=algorithm, inplace=inplace)  # fmt: skip
    entry = plan.fusion
    if plan.error is not None or entry is None:
        return None
    xp = np if on_host else ON_DEVICE
    if not kind.carried_by(select(settings, xp, entry.op, dtype)):
        return None
    factor = result_factor(entry.op, entry.postscale, plan.comm.size)
    if (entry.prescale != 1.0 or factor != 1.0) and not kind.scales_alike(dtype):
        return None
    fields, key = plan.fields, entry.key
    if not on_host and fields["device"] == "cpu":
        # A GPU tensor whose view is staged through host memory (no CuPy array holds it:
        # bfloat16, or CuPy missing) stays on its GPU here, and is agreed on as GPU data, as
        # small_allreduce.tensor_allreduce agrees on it; a joined rank's zeros follow
        # (fusion.zeros_entry).
        fields = dict(fields, device="cuda")
        key = fusion_key(dtype, entry.op, entry.prescale, entry.postscale, entry.requested, xp)
    comm, ranks = (plan.comm, plan.ranks) if process_set is global_process_set else (None, None)
    return entry.op, entry.requested, fields, key, dtype, xp, comm, ranks


# ---------------------------------------------------------------------------------------------
# Broadcast, all-gather, all-to-all and reduce-scatter of a framework's tensor as it is.
#
# Whether a tensor goes as it is depends only on what every rank agrees on or shares (its
# dtype, whether it lies on a GPU, the op and factors, the settings and the libraries here), not
# on its layout or stream: a rank whose tensor went as a view staged through host memory would
# meet the others' NCCL call with an MPI one. A tensor that does not lie in its logical order is
# copied into one that does. Where an argument is bad, the view's plan reports it on every rank
# (the fields differ, or the view's plan carries the error).


def tensor_broadcast_plan(tensor, kind, root_rank, name, process_set,
                          inplace: bool) -> Optional[Plan]:  # fmt: skip
    """Return broadcast_plan() of a framework's `tensor` that its transport moves as it is (the
    kind's tensors, no view), or None where it goes as a view (see tensor_allreduce_plan)."""
    moved = _moved(tensor, kind)
    if moved is None:
        return None
    dtype, shape, transport = moved
    comm, ranks = communicator(process_set)
    try:
        root = root_index(root_rank, ranks)
    except (TypeError, ValueError):
        return None
    fields = array_fields("broadcast", name, Described(dtype, shape), root_rank=root_rank)

    def execute(comm, _):
        if inplace and kind.contiguous(tensor):
            transport.broadcast(comm, kind.flat(tensor), root)
            return tensor
        buf = kind.new(tensor, math.prod(shape))
        if inplace or comm.rank == root:  # (the others' values are overwritten)
            buf.reshape(shape)[...] = tensor
        transport.broadcast(comm, buf, root)
        if not inplace:
            return buf.reshape(shape)
        tensor[...] = buf.reshape(shape)
        return tensor

    return Plan(fields, set_id(process_set), comm, ranks, execute=execute)


def tensor_allgather_plan(tensor, kind, name, process_set) -> Optional[Plan]:
    """Return allgather_plan() of a framework's `tensor` as it is (see tensor_broadcast_plan)."""
    moved = _moved(tensor, kind)
    if moved is None or not moved[1]:  # (a 0-d tensor: the view's plan reports it)
        return None
    dtype, shape, transport = moved
    comm, ranks = communicator(process_set)
    fields = array_fields("allgather", name, Described(dtype, shape), trailing=True)

    def execute(comm, rows):
        row = math.prod(shape[1:])
        counts = [r * row for r in rows]
        out = kind.new(tensor, sum(counts))
        transport.allgatherv(comm, _flat(kind, tensor, shape), out, counts)
        return out.reshape((sum(rows), *shape[1:]))

    return Plan(fields, set_id(process_set), comm, ranks, payload=shape[0], execute=execute)


def tensor_allgather_into_plan(out, kind, rows, name, process_set) -> Optional[Plan]:
    """Return allgather_into_plan() of a framework's tensor `out` as it is (see
    tensor_broadcast_plan): the ranks' rows gathered into it, in place."""
    moved = _moved(out, kind)
    if moved is None:
        return None
    dtype, shape, transport = moved
    described = Described(dtype, shape)
    try:
        check_gather_into(described, rows)
    except ValueError:
        return None
    comm, ranks = communicator(process_set)
    fields = array_fields("allgather_into", name, described)

    def execute(comm, counts):
        check_gathered_rows(counts, shape[0])
        row = math.prod(shape[1:])
        where = kind.contiguous(out)
        buf = kind.flat(out) if where else _flat(kind, out, shape)
        transport.allgatherv(comm, None, buf, [c * row for c in counts])
        if not where:  # (gathered in a copy in the logical order: back into the tensor)
            out[...] = buf.reshape(shape)
        return out

    return Plan(fields, set_id(process_set), comm, ranks, payload=rows, execute=execute)


def tensor_alltoall_plan(tensor, kind, splits, name, process_set) -> Optional[Plan]:
    """Return alltoall_plan() of a framework's `tensor` as it is (see tensor_broadcast_plan);
    `splits` as alltoall()'s (a numpy array, a list, or None). The result is the framework's
    tensor, with the received splits (a numpy int32 array) where `splits` is given."""
    moved = _moved(tensor, kind)
    if moved is None or not moved[1]:
        return None
    dtype, shape, transport = moved
    comm, ranks = communicator(process_set)
    try:
        send_splits = parse_splits(splits, shape[0], comm.size)
    except ValueError:
        return None
    fields = array_fields("alltoall", name, Described(dtype, shape), trailing=True,
                          splits_given=splits is not None)  # fmt: skip

    def execute(comm, rows):
        received = received_splits_of(comm, send_splits, splits, rows)
        row, rows = math.prod(shape[1:]), int(received.sum())
        out = kind.new(tensor, rows * row)
        transport.alltoallv(comm, _flat(kind, tensor, shape), (send_splits * row).tolist(), out,
                            (received * row).tolist())  # fmt: skip
        out = out.reshape((rows, *shape[1:]))
        return out if splits is None else (out, received.astype(np.int32))

    payload = None if splits is not None else shape[0]
    return Plan(fields, set_id(process_set), comm, ranks, payload=payload, execute=execute)


def tensor_reducescatter_plan(tensor, kind, name, options: dict) -> Optional[Plan]:
    """Return reducescatter_plan() of a framework's `tensor` as it is (see
    tensor_broadcast_plan); `options` are reducescatter()'s other keyword arguments. A result
    scaled in a dtype the kind does not scale as the general way goes as a view."""
    settings = current().settings
    if not _taken(tensor, kind, settings) or not _OPTIONS.issuperset(options):
        return None
    get = options.get
    prescale, postscale = get("prescale_factor", 1.0), get("postscale_factor", 1.0)
    process_set = get("process_set", global_process_set)
    dtype, shape, on_host = kind.describe(tensor)
    comm, ranks = communicator(process_set)
    try:
        resolved, requested = reducescatter_arguments(
            Described(dtype, shape), get("op", ReduceOp.AVERAGE), prescale, postscale,
            get("algorithm"), comm.size, settings,
        )  # fmt: skip
        xp = np if on_host else ON_DEVICE
        transport = select(settings, xp, resolved, dtype)
    except (TypeError, ValueError, NotImplementedError):
        return None
    factor = result_factor(resolved, postscale, comm.size)
    if not kind.carried_by(transport) or (
        (prescale != 1.0 or factor != 1.0) and not kind.scales_alike(dtype)
    ):
        return None
    fields = allreduce_fields(name, Described(dtype, shape), resolved, prescale, postscale,
                              requested, None, "reducescatter")  # fmt: skip
    combined = combined_as(resolved)

    def execute(comm, _):
        row = math.prod(shape[1:])
        rows = chunk_bounds(shape[0], comm.size)
        bounds = tuple((lo * row, hi * row) for lo, hi in rows)
        # Equal chunks among several ranks: the library reads the tensor and writes a new
        # result (transport.GroupTransport.reducescatter); otherwise it reduces in place, in a
        # copy, as a prescale does.
        even = comm.size > 1 and row * shape[0] > 0 and len({hi - lo for lo, hi in rows}) == 1
        if even and prescale == 1.0 and kind.contiguous(tensor):
            buf = kind.flat(tensor)
        else:
            buf = kind.new(tensor, math.prod(shape))
            buf.reshape(shape)[...] = tensor
            if prescale != 1.0:
                kind.scale(buf, float(prescale))
        mine = transport.reducescatter(comm, buf, bounds, combined, xp, requested)
        if factor != 1.0:
            kind.scale(mine, factor)
        lo, hi = rows[comm.rank]
        return mine.reshape((hi - lo, *shape[1:]))

    return Plan(fields, set_id(process_set), comm, ranks, execute=execute)


def _moved(tensor, kind):
    """Return (numpy dtype, shape, transport) where the transport that moves data like `tensor`
    (no reduction) takes it as it is, else None."""
    settings = current().settings
    if not _taken(tensor, kind, settings):
        return None
    dtype, shape, on_host = kind.describe(tensor)
    return dtype, shape, select(settings, np if on_host else ON_DEVICE)


def _taken(tensor, kind, settings) -> bool:
    """small_allreduce.tensors_taken(): one look-up, where most tensors answer no (host tensors
    go to MPI by default); False where a transport is named but missing (the view's way reports
    it on every rank)."""
    try:
        return small_allreduce.tensors_taken(tensor, kind, templates(settings), settings)
    except ValueError:
        return False


def _flat(kind, tensor, shape: tuple):
    """Return a flat tensor of `tensor`'s values in its logical order: itself, or a copy."""
    if kind.contiguous(tensor):
        return kind.flat(tensor)
    buf = kind.new(tensor, math.prod(shape))
    buf.reshape(shape)[...] = tensor
    return buf
