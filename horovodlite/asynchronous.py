"""Asynchronous collectives: submit to the engine, then poll() and synchronize() the handle.

Each `*_async` function builds the same Plan as its synchronous twin (collectives.py) and hands
it to the engine, so the two share one implementation and one documentation: each takes its
twin's arguments. Requests are matched across ranks by name; unnamed ones are named
"<collective>.noname.<n>" in submission order, as Horovod does. A name is held from submission
until the collective has finished on this rank, synchronized or not.

join() and barrier() live here because they meet both worlds: the synchronous collectives of
other ranks, and this rank's engine.
"""

import functools
from typing import Callable

from . import collectives
from . import state as _state
from .collectives import (
    allgather_plan,
    allreduce_plan,
    alltoall_plan,
    broadcast_plan,
    reducescatter_plan,
)
from .handles import Handle
from .joining import join_collectives
from .plan import signature_of
from .process_sets import global_process_set

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
]


def _engine():
    return _state.current().engine


def _asynchronous(make_plan: Callable, name: str, **fixed) -> Callable:
    """Return `name`: start `make_plan(...)`'s collective in the background, return a Handle."""

    @functools.wraps(make_plan)
    def start(*args, **kwargs) -> Handle:
        return _engine().submit([make_plan(*args, **fixed, **kwargs)])

    start.__name__ = start.__qualname__ = name
    start.__doc__ = f"Start {name.split('_async')[0]}() in the background; return a Handle."
    start.__signature__ = signature_of(make_plan, fixed, Handle)
    return start


def _grouped(make_plan: Callable, name: str, **fixed) -> Callable:
    """Return `name`: start `make_plan`'s collective on every array of a list, as one Handle.

    synchronize() returns the list of results. The arrays are named "<name>.0", "<name>.1", ...
    """

    def start(tensors, *, name=None, **options) -> Handle:
        names = [None if name is None else f"{name}.{i}" for i in range(len(tensors))]
        plans = [make_plan(t, name=n, **fixed, **options) for t, n in zip(tensors, names)]
        return _engine().submit(plans, grouped=True)

    start.__name__ = start.__qualname__ = name
    kind = name.split("_async")[0].removeprefix("grouped_")
    start.__doc__ = (
        f"Start {kind}() of every array in `tensors` (same options); synchronize() returns "
        "the list of results."
    )
    return start


allreduce_async = _asynchronous(allreduce_plan, "allreduce_async")
allreduce_async_ = _asynchronous(allreduce_plan, "allreduce_async_", inplace=True)
grouped_allreduce_async = _grouped(allreduce_plan, "grouped_allreduce_async")
grouped_allreduce_async_ = _grouped(allreduce_plan, "grouped_allreduce_async_", inplace=True)
allgather_async = _asynchronous(allgather_plan, "allgather_async")
grouped_allgather_async = _grouped(allgather_plan, "grouped_allgather_async")
broadcast_async = _asynchronous(broadcast_plan, "broadcast_async")
broadcast_async_ = _asynchronous(broadcast_plan, "broadcast_async_", inplace=True)
reducescatter_async = _asynchronous(reducescatter_plan, "reducescatter_async")
grouped_reducescatter_async = _grouped(reducescatter_plan, "grouped_reducescatter_async")
alltoall_async = _asynchronous(alltoall_plan, "alltoall_async")


def poll(handle: Handle) -> bool:
    """Return whether `handle`'s collective has finished."""
    return handle.done()


def synchronize(handle: Handle):
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
