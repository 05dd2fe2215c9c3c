"""The grouped collectives: a list of arrays, one agreement for all of them.

Horovod negotiates a grouped request whole; so do these blocking forms. The member plans are
the single collectives' (collectives.py), named "<name>.0", "<name>.1", ...; one agreement on
all their fields makes an argument error on any rank fail the group on every rank before any
data moves. Then the all-reduces travel fused, one buffer per dtype and device, and the other
members run one after the other. (The asynchronous grouped forms hand the same plans to the
engine, asynchronous.py.)
"""

import numpy as np

from .collectives import allgather_plan, allreduce_plan, reducescatter_plan
from .fusion import fused_by_kind
from .plan import Plan, run_now, waiter
from .process_sets import global_process_set
from .state import current
from .tensor_plans import tensor_allgather_plan, tensor_allreduce_plan, tensor_reducescatter_plan

__all__ = ["grouped_allreduce", "grouped_allgather", "grouped_reducescatter"]
# (the grouped_tensor_* forms are the bindings' own: horovodlite's top level shows these)


def grouped_allreduce(tensors, *, name=None, **options) -> list:
    """All-reduce a list of arrays with one agreement; return the results in order.

    Takes allreduce()'s options. Arrays of one dtype and device travel in one fused buffer;
    mixed dtypes make one buffer per kind. `name` names the group; the arrays are named
    "<name>.0", "<name>.1", ... in errors.
    """
    plans = [allreduce_plan(t, name=n, **options) for t, n in _members(tensors, name, "allreduce")]
    return _fused(name, plans)


def grouped_tensor_allreduce(tensors, kind, name, inplace: bool, options: dict):
    """grouped_allreduce() of a framework's `tensors` as they are (tensor_plans.py; `kind` is
    the binding's tensor_kind.TensorKind, `options` allreduce()'s other keyword arguments, less
    `average`); None where any of them must go as a numpy or CuPy view (then they all do).

    For the bindings; the same agreement and fused batches as grouped_allreduce's, so the ranks
    meet whichever way each takes. The grouped_tensor_* forms below are the same for the other
    grouped collectives.
    """

    def plan_of(tensor, member):
        return tensor_allreduce_plan(tensor, kind, member, inplace, options)

    return _as_they_are(plan_of, tensors, name, "allreduce", _fused)


def _fused(name, plans: list) -> list:
    """Run the grouped all-reduce of the member `plans`: one agreement, fused batches."""

    def execute(comm, _):
        return fused_by_kind(comm, [plan.fusion for plan in plans])

    return _run_group("grouped_allreduce", name, plans, execute)


def _as_they_are(plan_of, tensors, name, kind: str, run):
    """Return `run(name, plans)` of the plans `plan_of(tensor, member name)` of `tensors` as
    they are, or None where any of them is None (then they all go as views)."""
    plans = []
    for tensor, member in _members(tensors, name, kind):
        plan = plan_of(tensor, member)
        if plan is None:
            return None
        plans.append(plan)
    return run(name, plans)


def _members(tensors, name, kind: str) -> list:
    """Pair each of `tensors` with its member name "<name>.i" ("grouped_<kind>.i" unnamed)."""
    prefix = name if name is not None else f"grouped_{kind}"
    return [(t, f"{prefix}.{i}") for i, t in enumerate(tensors)]


def _run_group(collective: str, name, plans: list, execute) -> list:
    """Agree on every member plan's fields at once, then return `execute(comm, fields)`.

    One agreement for the group, as Horovod negotiates a grouped request whole: a member's
    argument error on any rank fails the group on every rank, before any data moves.
    """
    if not plans:
        return []
    error = next((p.error for p in plans if p.error is not None), None)
    fields = {
        "collective": collective,
        "name": name,
        # (in the fields' own order, as a single collective's digest takes them: the same code
        # builds them on every rank)
        "members": tuple(tuple(p.fields.items()) for p in plans),
    }
    first = plans[0]
    group = Plan(fields, first.process_set_id, first.comm, first.ranks, error,
                 execute=lambda comm, _: execute(comm, fields))  # fmt: skip
    return run_now(group)


def grouped_allgather(tensors, *, name=None, process_set=global_process_set) -> list:
    """Allgather a list of arrays with one agreement; return the gathered arrays in order.

    Dimension 0 of each may differ between ranks; members are named as grouped_allreduce()'s.
    """
    plans = [
        allgather_plan(t, name=n, process_set=process_set)
        for t, n in _members(tensors, name, "allgather")
    ]
    return _gathered(name, plans)


def grouped_tensor_allgather(tensors, kind, name, process_set) -> list:
    """grouped_allgather() of a framework's `tensors` as they are, or None (see
    grouped_tensor_allreduce)."""

    def plan_of(tensor, member):
        return tensor_allgather_plan(tensor, kind, member, process_set)

    return _as_they_are(plan_of, tensors, name, "allgather", _gathered)


def _gathered(name, plans: list) -> list:
    """Run the grouped all-gather of the member `plans`: one agreement, one exchange of rows."""

    def execute(comm, fields):
        # Every rank's rows of every member, in one exchange after the agreement.
        rows = np.empty((comm.size, len(plans)), dtype=np.int64)
        own = np.array([plan.payload for plan in plans], dtype=np.int64)
        waiter(current(), fields, plans[0].ranks)(comm.Iallgather(own, rows))
        return [plan.execute(comm, rows[:, i].tolist()) for i, plan in enumerate(plans)]

    return _run_group("grouped_allgather", name, plans, execute)


def grouped_reducescatter(tensors, *, name=None, **options) -> list:
    """Reduce-scatter a list of arrays with one agreement; return this rank's rows of each.

    Takes reducescatter()'s options; members are named as grouped_allreduce()'s.
    """
    plans = [
        reducescatter_plan(t, name=n, **options)
        for t, n in _members(tensors, name, "reducescatter")
    ]
    return _scattered(name, plans)


def grouped_tensor_reducescatter(tensors, kind, name, options: dict) -> list:
    """grouped_reducescatter() of a framework's `tensors` as they are (`options`:
    reducescatter()'s other keyword arguments), or None (see grouped_tensor_allreduce)."""

    def plan_of(tensor, member):
        return tensor_reducescatter_plan(tensor, kind, member, options)

    return _as_they_are(plan_of, tensors, name, "reducescatter", _scattered)


def _scattered(name, plans: list) -> list:
    def execute(comm, _):
        return [plan.execute(comm, None) for plan in plans]

    return _run_group("grouped_reducescatter", name, plans, execute)
