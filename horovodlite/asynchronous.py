"""Asynchronous collectives: submit to the engine, then poll() and synchronize() the handle.

Each `*_async` function builds the same Plan as its blocking twin (collectives.py) and hands it
to the engine (`_submit`), so the two share one implementation; the twin documents the
arguments, and each function here says only what differs. Requests are matched across ranks by
name; unnamed ones are named "<collective>.noname.<n>" in submission order, as Horovod does. A
name is held from submission until the collective has finished on this rank, synchronized or not.

Every `*_async` function raises at once, on this rank only: NotInitializedError before init();
TypeError or ValueError for a `process_set` that is not a registered set holding this rank;
ValueError when a request of the same name is already in flight here; HorovodLiteError when the
engine has stopped. Any other bad argument, and ranks that disagree, are raised by synchronize()
on every rank: the rank at fault gets its own TypeError or ValueError, the others a
MismatchError naming it.

join() and barrier() live here because they meet both worlds: the synchronous collectives of
other ranks, and this rank's engine.
"""

from typing import Optional

import numpy as np

from . import collectives
from . import state as _state
from .buffers import array_module, is_cupy_array
from .checks import set_id
from .collectives import (
    allgather_plan,
    allreduce_plan,
    alltoall_plan,
    broadcast_plan,
    reducescatter_plan,
    template_key,
)
from .fusion import FusionEntry
from .handles import Handle, Request
from .joining import join_collectives
from .ops import ReduceOp
from .plan import Plan, templates
from .process_sets import communicator, global_process_set
from .tensor_kind import TensorKind
from .tensor_plans import tensor_allgather_plan, tensor_allreduce_plan, tensor_reducescatter_plan

__all__ = [
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "allgather_async",
    "grouped_allgather_async",
    "broadcast_async",
    "broadcast_async_",
    "reducescatter_async",
    "grouped_reducescatter_async",
    "alltoall_async",
    "poll",
    "synchronize",
    "join",
    "barrier",
    "start_timeline",
    "stop_timeline",
]  # (the tensor_* and grouped_tensor_* forms are the bindings' own: the top level shows these)


def _engine():
    return _state.current().engine


def _submit(plans: list, grouped: bool = False):
    """Queue `plans` on this rank's engine; return their handle: a Handle (a list result if
    `grouped`), or the Request itself of one plan alone."""
    return _engine().submit(plans, grouped)


def _member_names(name, count: int) -> list:
    """Name the members of a grouped request "<name>.0", "<name>.1", ... (None: unnamed)."""
    return [None if name is None else f"{name}.{i}" for i in range(count)]


# -- all-reduce -------------------------------------------------------------------------------


def repeated_allreduce_plan(
    tensor, op, name, prescale_factor, postscale_factor, process_set, algorithm, inplace
) -> Optional[tuple]:
    """Return (plan, entry) for allreduce_plan() of these arguments (`average` None) with the
    least work, where an earlier call with the same arguments, dtype and shape left its template
    (plan.templates); else None, and allreduce_plan() builds the plan (and finds any error).

    The asynchronous all-reduce's way: a backward pass submits every gradient this way, every
    step. The plan, without this call's array, is the template's own, shared by the calls
    (`Engine.submit_one` takes the call's FusionEntry beside it); only the entry is new. It
    takes numpy and CuPy arrays as they are (no conversion to try) and builds no inline route,
    which only the blocking call takes (docs/engine.md). As tensor_plans' key does, the process
    set itself stands for its size in the key, and the global set's communicator is kept in the
    template's plan (with the state it belongs to): a repeated call looks up no set.
    """
    if type(tensor) is np.ndarray:
        xp = np
    elif is_cupy_array(tensor):
        xp = array_module(tensor)
    else:
        return None  # (anything else is viewed as an array first: allreduce_plan)
    key = template_key(name, op, prescale_factor, postscale_factor, algorithm, inplace,
                       process_set, tensor, xp)  # fmt: skip
    if key is None:
        return None
    state = _state.current()
    memo = templates(state.settings)
    template = memo.get(key)
    if template is None or template[-1] is not state:
        comm, ranks = communicator(process_set)  # (raises for a set that is gone, as both ways do)
        general = memo.get(template_key(name, op, prescale_factor, postscale_factor, algorithm,
                                        inplace, comm.size, tensor, xp))  # fmt: skip
        if general is None:
            return None  # (the general way leaves it)
        template = memo[key] = _repeated_template(general, process_set, comm, ranks, state)
    if inplace and not getattr(tensor.flags, "writeable", True):
        return None
    resolved, requested, fusion, plan, fields, _ = template
    if plan is None:  # another set than the global one: looked up on every call, as it may go
        comm, ranks = communicator(process_set)
        plan = Plan(fields, set_id(process_set), comm, ranks)
    entry = FusionEntry(tensor, xp, inplace, resolved, prescale_factor, postscale_factor,
                        requested, fusion)  # fmt: skip
    return plan, entry


def _repeated_template(general: tuple, process_set, comm, ranks, state) -> tuple:
    """Return (op, requested algorithm, fusion key, plan, fields, state):
    repeated_allreduce_plan's template, from the template the general way left under the set's
    size. The plan holds no array (the calls share it); None for a set other than the global
    one, whose communicator is looked up on every call."""
    resolved, requested, fields, _, fusion = general
    plan = None
    if process_set is global_process_set:
        plan = Plan(fields, set_id(process_set), comm, ranks)
    return resolved, requested, fusion, plan, fields, state


def allreduce_async(
    tensor,
    *,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
    inplace=False,
) -> Request:
    """Start allreduce() of `tensor` in the background; return its handle (a Request).

    The arguments are allreduce()'s. synchronize() returns a new array, or `tensor` itself
    with `inplace`, which must not change until then.

    Raises:
        see horovodlite.asynchronous: submission errors here, the collective's in synchronize().
    """
    if average is None:
        repeated = repeated_allreduce_plan(
            tensor, op, name, prescale_factor, postscale_factor, process_set, algorithm, inplace
        )
        if repeated is not None:
            plan, entry = repeated
            return _engine().submit_one(plan, entry)
    plan = allreduce_plan(
        tensor, op=op, name=name, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, process_set=process_set, algorithm=algorithm,
        average=average, inplace=inplace,
    )  # fmt: skip
    return _engine().submit_one(plan)


def allreduce_async_(
    tensor,
    *,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
) -> Request:
    """Start allreduce_() of `tensor` in the background; return its handle (a Request).

    As allreduce_async(..., inplace=True): synchronize() writes the result into `tensor` and
    returns it.
    """
    return allreduce_async(
        tensor, op=op, name=name, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, process_set=process_set, algorithm=algorithm,
        average=average, inplace=True,
    )  # fmt: skip


def tensor_allreduce_async(tensor, kind: TensorKind, name, inplace: bool, options: dict):
    """Start allreduce_async() of a framework's `tensor` as it is; return its handle (a
    Request), or None where it must go as a numpy or CuPy view (tensor_plans.tensor_allreduce_plan
    says when).

    A binding's way (`kind`: its tensor_kind.TensorKind) where its transport moves its tensors
    without a view: synchronize() returns the framework's tensor, new, or `tensor` itself
    with `inplace`. `options` are allreduce_async()'s other keyword arguments, less `average`
    (a mapping, as the binding holds them: no keyword packing on a gradient's way).
    """
    plan = tensor_allreduce_plan(tensor, kind, name, inplace, options)
    return None if plan is None else _engine().submit_one(plan)


def tensor_plan_async(plan) -> Request:
    """Start a framework tensor's collective as it is (tensor_plans.py: a broadcast, all-gather,
    all-to-all or reduce-scatter plan) in the background; return its handle (a Request).

    A binding's way: synchronize() returns the framework's tensor (new, or the input itself
    where the collective writes in place)."""
    return _engine().submit_one(plan)


def grouped_tensor_allgather_async(tensors, kind: TensorKind, name, process_set) -> Handle:
    """Start grouped_allgather_async() of a framework's `tensors` as they are; return a Handle,
    or None where any of them must go as a view (then they all do)."""
    return _tensor_group(
        lambda tensor, member: tensor_allgather_plan(tensor, kind, member, process_set),
        tensors,
        name,
    )


def grouped_tensor_reducescatter_async(tensors, kind: TensorKind, name, options: dict) -> Handle:
    """Start grouped_reducescatter_async() of a framework's `tensors` as they are (`options`:
    reducescatter()'s other keyword arguments); return a Handle, or None where any of them must
    go as a view (then they all do)."""
    return _tensor_group(
        lambda tensor, member: tensor_reducescatter_plan(tensor, kind, member, options),
        tensors,
        name,
    )


def grouped_tensor_allreduce_async(tensors, kind: TensorKind, name, inplace: bool, options: dict):
    """Start grouped_allreduce_async() of a framework's `tensors` as they are; return a Handle,
    or None where any of them must go as a numpy or CuPy view (then they all do): as
    tensor_allreduce_async(), for a group."""
    return _tensor_group(
        lambda tensor, member: tensor_allreduce_plan(tensor, kind, member, inplace, options),
        tensors,
        name,
    )


def _tensor_group(plan_of, tensors, name):
    """Submit `plan_of(tensor, member name)` of each of `tensors` as one grouped request; return
    its Handle, or None where any plan is None (all then go as views)."""
    plans = []
    for tensor, member in zip(tensors, _member_names(name, len(tensors))):
        plan = plan_of(tensor, member)
        if plan is None:
            return None
        plans.append(plan)
    return _submit(plans, grouped=True)


def grouped_allreduce_async(
    tensors,
    *,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
    inplace=False,
) -> Handle:
    """Start allreduce_async() of every array in `tensors`, with the same arguments, as one Handle.

    synchronize() returns the list of results, in order. The members are named "<name>.0",
    "<name>.1", ... (numbered in submission order when `name` is None); the engine fuses them
    as it fuses any all-reduces.

    Raises:
        see horovodlite.asynchronous: submission errors here, the collective's in synchronize().
    """
    return _submit([
        allreduce_plan(
            t, op=op, name=n, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
            process_set=process_set, algorithm=algorithm, average=average, inplace=inplace,
        )
        for t, n in zip(tensors, _member_names(name, len(tensors)))
    ], grouped=True)  # fmt: skip


def grouped_allreduce_async_(
    tensors,
    *,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
) -> Handle:
    """Start allreduce_() of every array in `tensors`: grouped_allreduce_async(inplace=True)."""
    return grouped_allreduce_async(
        tensors, op=op, name=name, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, process_set=process_set, algorithm=algorithm,
        average=average, inplace=True,
    )  # fmt: skip


# -- data movement ----------------------------------------------------------------------------


def allgather_async(tensor, *, name=None, process_set=global_process_set) -> Request:
    """Start allgather() of `tensor` in the background; return its handle (a Request).

    The arguments are allgather()'s; synchronize() returns the gathered array.

    Raises:
        see horovodlite.asynchronous: submission errors here, the collective's in synchronize().
    """
    return _submit([allgather_plan(tensor, name=name, process_set=process_set)])


def grouped_allgather_async(tensors, *, name=None, process_set=global_process_set) -> Handle:
    """Start allgather() of every array in `tensors` as one Handle.

    synchronize() returns the list of gathered arrays; the members are named "<name>.0",
    "<name>.1", ...

    Raises:
        see horovodlite.asynchronous: submission errors here, the collective's in synchronize().
    """
    return _submit([
        allgather_plan(t, name=n, process_set=process_set)
        for t, n in zip(tensors, _member_names(name, len(tensors)))
    ], grouped=True)  # fmt: skip


def broadcast_async(
    tensor, root_rank, *, name=None, process_set=global_process_set, inplace=False
) -> Request:
    """Start broadcast() of `tensor` from global rank `root_rank`; return its handle (a Request).

    The arguments are broadcast()'s. synchronize() returns a new array, or `tensor` itself
    with `inplace`.

    Raises:
        see horovodlite.asynchronous: submission errors here, the collective's in synchronize().
    """
    return _submit([broadcast_plan(
        tensor, root_rank, name=name, process_set=process_set, inplace=inplace
    )])  # fmt: skip


def broadcast_async_(tensor, root_rank, *, name=None, process_set=global_process_set) -> Request:
    """Start broadcast_(): broadcast_async(..., inplace=True), which overwrites `tensor`."""
    return broadcast_async(tensor, root_rank, name=name, process_set=process_set, inplace=True)


def reducescatter_async(
    tensor,
    *,
    op=ReduceOp.AVERAGE,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
) -> Request:
    """Start reducescatter() of `tensor` in the background; return its handle (a Request).

    The arguments are reducescatter()'s; synchronize() returns this rank's rows.

    Raises:
        see horovodlite.asynchronous: submission errors here, the collective's in synchronize().
    """
    return _submit([reducescatter_plan(
        tensor, op=op, name=name, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, process_set=process_set, algorithm=algorithm,
    )])  # fmt: skip


def grouped_reducescatter_async(
    tensors,
    *,
    op=ReduceOp.AVERAGE,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
) -> Handle:
    """Start reducescatter() of every array in `tensors`, with the same arguments, as one Handle.

    synchronize() returns the list of this rank's rows of each; the members are named
    "<name>.0", "<name>.1", ...

    Raises:
        see horovodlite.asynchronous: submission errors here, the collective's in synchronize().
    """
    return _submit([
        reducescatter_plan(
            t, op=op, name=n, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
            process_set=process_set, algorithm=algorithm,
        )
        for t, n in zip(tensors, _member_names(name, len(tensors)))
    ], grouped=True)  # fmt: skip


def alltoall_async(tensor, splits=None, *, name=None, process_set=global_process_set) -> Request:
    """Start alltoall() of `tensor` in the background; return its handle (a Request).

    The arguments are alltoall()'s; synchronize() returns what it returns (the received array,
    with the received splits when `splits` is given).

    Raises:
        see horovodlite.asynchronous: submission errors here, the collective's in synchronize().
    """
    return _submit([alltoall_plan(tensor, splits, name=name, process_set=process_set)])


# -- waiting, and the calls that meet the synchronous world -----------------------------------


def poll(handle) -> bool:
    """Return whether `handle`'s collective has finished."""
    return handle.done()


def synchronize(handle):
    """Wait for `handle`'s collective and return its result (or raise its error)."""
    return handle.wait()


def join() -> int:
    """Join: contribute zeros to all-reduces until every rank has joined; return the last rank.

    A rank that runs out of data calls join(); the others keep training, and their all-reduces,
    synchronous or not, still divide by the full number of ranks for Average. Their other
    collectives (allgather, broadcast, alltoall, reducescatter) raise HorovodLiteError while a
    rank has joined.

    Returns the rank that joined last, the same on every rank whatever the timing: each join
    takes effect in one negotiation cycle of the engines, agreed by every rank, before this
    rank answers any collective; the last is the rank whose join took effect in the latest
    cycle (the highest rank, if several joined in that cycle). A rank that joins after it saw
    another rank's join (a collective that raised, or that got zeros from it) joins in a later
    cycle, so it is counted after that rank.
    """
    state = _state.current()
    state.engine.begin_join()  # returns once the join took effect: see Engine.begin_join
    join_collectives(state)
    return state.engine.end_join()


def barrier(*, process_set=global_process_set) -> None:
    """Wait until every rank of the process set reaches this call.

    Then wait until the asynchronous collectives that all of them submitted before it have
    finished on this rank, synchronized or not, so that their names are free again: in Horovod
    a barrier queues behind them.
    """
    collectives.barrier(process_set=process_set)
    _engine().drain()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record the engine's work as a Chrome-trace JSON at `file_path` (written by rank 0)."""
    _engine().start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop recording the timeline and close its file."""
    _engine().stop_timeline()
