"""Asynchronous collectives: submit to the engine, then poll() and synchronize() the handle.

Each `*_async` function builds the same Plan as its synchronous twin (collectives.py) and hands
it to the engine, so the two share one implementation. Requests are matched across ranks by name;
unnamed ones are named "<collective>.noname.<n>" in submission order, as Horovod does.
"""

from . import state as _state
from .collectives import (
    allgather_plan,
    allreduce_plan,
    alltoall_plan,
    broadcast_plan,
    reducescatter_plan,
)
from .engine import Handle
from .ops import ReduceOp
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
    "start_timeline",
    "stop_timeline",
]


def _engine():
    return _state.current().engine


def _group_names(name, count: int, kind: str) -> list:
    return [None if name is None else f"{name}.{i}" for i in range(count)] if count else []


def allreduce_async(
    tensor,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
) -> Handle:
    """Start allreduce() in the background; return a Handle for synchronize()."""
    plan = allreduce_plan(
        tensor, op, name, prescale_factor, postscale_factor, process_set, algorithm, average
    )
    return _engine().submit([plan])


def allreduce_async_(
    tensor,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
) -> Handle:
    """Start allreduce_() (in place) in the background; return a Handle."""
    plan = allreduce_plan(
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
    return _engine().submit([plan])


def grouped_allreduce_async(
    tensors,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
    inplace=False,
) -> Handle:
    """Start an all-reduce of every array in `tensors`; synchronize() returns the list."""
    names = _group_names(name, len(tensors), "allreduce")
    plans = [
        allreduce_plan(
            t, op, n, prescale_factor, postscale_factor, process_set, algorithm, average, inplace
        )
        for t, n in zip(tensors, names)
    ]
    return _engine().submit(plans, grouped=True)


def grouped_allreduce_async_(
    tensors,
    op=None,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
    average=None,
) -> Handle:
    """In-place grouped_allreduce_async()."""
    return grouped_allreduce_async(
        tensors,
        op,
        name,
        prescale_factor,
        postscale_factor,
        process_set,
        algorithm,
        average,
        inplace=True,
    )


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Start allgather() in the background; return a Handle."""
    return _engine().submit([allgather_plan(tensor, name, process_set)])


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    """Start an allgather of every array in `tensors`; synchronize() returns the list."""
    names = _group_names(name, len(tensors), "allgather")
    plans = [allgather_plan(t, n, process_set) for t, n in zip(tensors, names)]
    return _engine().submit(plans, grouped=True)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Start broadcast() in the background; return a Handle."""
    return _engine().submit([broadcast_plan(tensor, root_rank, name, process_set)])


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Start broadcast_() (in place) in the background; return a Handle."""
    return _engine().submit([broadcast_plan(tensor, root_rank, name, process_set, inplace=True)])


def reducescatter_async(
    tensor,
    op=ReduceOp.AVERAGE,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
) -> Handle:
    """Start reducescatter() in the background; return a Handle."""
    plan = reducescatter_plan(
        tensor, op, name, prescale_factor, postscale_factor, process_set, algorithm
    )
    return _engine().submit([plan])


def grouped_reducescatter_async(
    tensors,
    op=ReduceOp.AVERAGE,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
) -> Handle:
    """Start a reduce-scatter of every array in `tensors`; synchronize() returns the list."""
    names = _group_names(name, len(tensors), "reducescatter")
    plans = [
        reducescatter_plan(t, op, n, prescale_factor, postscale_factor, process_set, algorithm)
        for t, n in zip(tensors, names)
    ]
    return _engine().submit(plans, grouped=True)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Start alltoall() in the background; return a Handle."""
    return _engine().submit([alltoall_plan(tensor, splits, name, process_set)])


def poll(handle: Handle) -> bool:
    """Return whether `handle`'s collective has finished."""
    return handle.done()


def synchronize(handle: Handle):
    """Wait for `handle`'s collective and return its result (or raise its error)."""
    return handle.wait()


def join() -> int:
    """Join: contribute zeros to all-reduces until every rank has joined; return the last rank.

    A rank that runs out of data calls join(); the others keep training, and their all-reduces
    still divide by the full number of ranks for Average.
    """
    return _engine().join()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record the engine's work as a Chrome-trace JSON at `file_path` (written by rank 0)."""
    _engine().start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop recording the timeline and close its file."""
    _engine().stop_timeline()
