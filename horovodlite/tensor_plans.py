"""The all-reduce plan of a framework's tensor that travels as it is: no numpy or CuPy view.

Where a binding's transport moves its tensors itself (torch's on torch.distributed's gloo and
NCCL groups), the engine hands the tensors to it as they are (fusion.TensorEntry): joined into
one buffer of the framework's, moved, and split back by the binding's `TensorKind`
(tensor_kind.py). The plan is the general way's own: its fields, checks and fusion key are
derived once from the plan of the tensor's view (collectives.allreduce_plan) and kept as a
template, so ranks on either way agree, fuse and reduce alike.
"""

from typing import Optional

import numpy as np

from . import small_allreduce
from .checks import set_id
from .collectives import allreduce_plan, template_key
from .fusion import TensorEntry, fusion_key
from .ops import result_factor
from .plan import Plan, run_now, templates
from .process_sets import communicator, global_process_set
from .state import current
from .transport import ON_DEVICE, select

__all__ = ["tensor_allreduce_now", "tensor_allreduce_plan"]

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
