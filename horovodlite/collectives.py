"""The collectives on numpy and GPU arrays.

Each collective is written once, as a `*_plan` function that validates the arguments and returns
a Plan (plan.py); it is documented as the collective it builds. The blocking forms run the plan
at once (`run_now`, through plan.synchronous), the asynchronous forms hand the same plan to the
engine (asynchronous.py). Argument errors found on one rank travel with the plan and are raised
on every rank after the agreement step, so a mistake never leaves the other ranks waiting.
Every argument after the data (tensor, root_rank, splits) is keyword-only.
"""

import math
from typing import Optional

import numpy as np

from . import algorithms, small_allreduce
from .agreement import array_fields, digest
from .algorithms.scratch import chunk_bounds
from .checks import (
    check_gathered_rows,
    check_reduction,
    check_rows,
    check_writable,
    checked,
    parse_splits,
    prepare,
    root_index,
    set_id,
)
from .fusion import FusionEntry, allreduce_fields, fusion_key
from .ops import ReduceOp, combined_as, resolve_op, result_factor
from .plan import Plan, run_now, signature_of, synchronous, templates, waiter
from .process_sets import communicator, global_process_set
from .staging import deliver, flat_work, result_buffer, scale
from .state import current
from .transport import select

__all__ = [
    "allreduce",
    "allreduce_",
    "broadcast",
    "broadcast_",
    "allgather",
    "allgather_into",
    "reducescatter",
    "alltoall",
    "broadcast_object",
    "allgather_object",
]  # the *_plan functions are the core's own: asynchronous.py builds on them
# barrier() is public from asynchronous.py, which also waits for the engine's work there.


# ---------------------------------------------------------------------------------------------
# All-reduce.


def allreduce_plan(
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
) -> Plan:
    """Return the reduction of `tensor` over all ranks of the process set.

    Args:
        tensor: a numpy array, a CuPy array, or any array with the buffer protocol,
            `__cuda_array_interface__` or DLPack. Same shape and dtype on every rank.
        op: Average (default), Sum, Min, Max, Product or Adasum. Average of integers
            truncates. Adasum (docs/adasum.md) takes float16, bfloat16, float32 or float64 on
            a power-of-two number of ranks, and runs its own algorithm whatever `algorithm` says.
        name: a name for error messages (and, in async use, for matching across ranks).
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result (after Average's division).
        process_set: the ranks taking part; default all.
        algorithm: "ring", "naive", "mpi", or None to choose by message size
            (HOROVODLITE_ALLREDUCE_ALGORITHM sets the default).
        average: deprecated; True means op=Average, False op=Sum.
        inplace: write the result into `tensor` and return it (what allreduce_() does).

    Raises:
        TypeError, ValueError: bad arguments on this rank (raised on every rank).
        HorovodLiteError: the ranks' arguments disagree, or another rank's were bad.
    """
    comm, ranks, array, xp, bad_input = prepare(tensor, process_set)
    if bad_input is None and average is None:  # (average warns on every call)
        plan = _templated_plan(array, xp, comm, ranks, op, name, prescale_factor,
                               postscale_factor, process_set, algorithm, inplace)  # fmt: skip
        if plan is not None:
            return plan
    settings = current().settings

    def parse():
        resolved = resolve_op(op, average)
        check_reduction(array, resolved, prescale_factor, postscale_factor, comm.size)
        if inplace:
            check_writable(array, "allreduce_")
        requested = algorithms.requested_algorithm(algorithm, settings.allreduce_algorithm)
        return resolved, requested

    parsed, error = checked(parse, bad_input)
    resolved, requested = parsed or (None, None)
    fields = allreduce_fields(
        name, array, resolved, prescale_factor, postscale_factor, requested, xp is np
    )
    entry = inline = None
    if error is None:
        scaled = prescale_factor != 1.0 or postscale_factor != 1.0
        travels = (
            xp is np
            and settings.check_metadata
            and small_allreduce.travels_inline(array, resolved, scaled, requested, comm.size)
            and select(settings, np, resolved, array.dtype).name == "mpi"  # data on MPI only
        )
        fusion = fusion_key(array.dtype, resolved, float(prescale_factor),
                            float(postscale_factor), requested, xp)  # fmt: skip
        key = None
        if average is None:
            key = template_key(name, op, prescale_factor, postscale_factor, algorithm, inplace,
                                comm.size, array, xp)  # fmt: skip
        if key is not None:
            templates(settings)[key] = (resolved, requested, fields, travels, fusion)
        entry = FusionEntry(
            array, xp, inplace, resolved, float(prescale_factor), float(postscale_factor),
            requested, fusion,
        )  # fmt: skip
        if travels:
            inline = _inline_route(fields, array, resolved, inplace, ranks)
    return Plan(fields, set_id(process_set), comm, ranks, error, execute=entry, fusion=entry,
                inline=inline)  # fmt: skip


# A training loop repeats each all-reduce: what follows from plain arguments, the array's dtype
# and shape and the set's size alone is checked and built once, its template (plan.templates):
# (resolved op, requested algorithm, fields, whether it travels inline, fusion key).


def _templated_plan(array, xp, comm, ranks, op, name, prescale, postscale, process_set,
                    algorithm, inplace: bool) -> Optional[Plan]:  # fmt: skip
    """Return the plan of these arguments built from their template, or None where there is
    none, or the array is read-only for an in-place call (the general way reports it). The plan
    has its inline route where the template says it travels inline (the blocking call takes it;
    the engine ignores it).
    """
    key = template_key(name, op, prescale, postscale, algorithm, inplace, comm.size, array, xp)
    if key is None:
        return None
    template = templates(current().settings).get(key)
    if template is None or (inplace and not getattr(array.flags, "writeable", True)):
        return None
    resolved, requested, fields, travels, fusion = template
    entry = FusionEntry(array, xp, inplace, resolved, prescale, postscale, requested, fusion)
    inline = _inline_route(fields, array, resolved, inplace, ranks) if travels else None
    # (Positionally: Plan's keyword arguments cost a tenth of a microsecond here.)
    return Plan(fields, set_id(process_set), comm, ranks, None, None, entry, entry, inline)


def _inline_route(fields: dict, array, resolved, inplace: bool, ranks):
    """Return `inline(comm)` for an all-reduce that travels inside its metadata check."""

    def inline(comm):
        wait = waiter(current(), fields, ranks)
        return small_allreduce.inline_allreduce(
            comm, digest(fields), array, resolved, inplace, lambda: fields, ranks, wait
        )

    return inline


def template_key(name, op, prescale, postscale, algorithm, inplace, group, array, xp):
    """Return the key of an all-reduce's template in plan.templates' memo, or None where an
    option is no plain value (a float that is an int or a numpy scalar, say, is checked anew
    every call). `group` stands for the ranks it runs on: their number, or their process set."""
    if (
        type(prescale) is float
        and type(postscale) is float
        and (op is None or type(op) is ReduceOp)
        and (name is None or type(name) is str)
        and (algorithm is None or type(algorithm) is str)
    ):
        return (name, op, prescale, postscale, algorithm, inplace, group, array.dtype,
                array.shape, xp)  # fmt: skip
    return None


def allreduce(tensor, **options):
    # The short path first: a small host array needs no Plan (small_allreduce.py).
    out = small_allreduce.short_allreduce(tensor, options)
    return run_now(allreduce_plan(tensor, **options)) if out is None else out


def allreduce_(tensor, **options):
    return allreduce(tensor, inplace=True, **options)


# Documented once, on the plan function; the blocking forms show its signature.
allreduce.__doc__ = allreduce_plan.__doc__
allreduce.__signature__ = signature_of(allreduce_plan, {})
allreduce_.__doc__ = "In-place allreduce(): write the result into `tensor` and return it."
allreduce_.__signature__ = signature_of(allreduce_plan, {"inplace": True})


# ---------------------------------------------------------------------------------------------
# Reduce-scatter.


def reducescatter_plan(
    tensor,
    *,
    op=ReduceOp.AVERAGE,
    name=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    algorithm=None,
) -> Plan:
    """Reduce `tensor` over the ranks and return this rank's slice of dimension 0.

    Rows are split as Horovod does: with n rows and k ranks, ranks 0 .. n % k - 1 get
    n // k + 1 rows and the others n // k. `algorithm` is "ring", "mpi" or None; the other
    arguments are allreduce()'s.
    """
    comm, ranks, array, xp, bad_input = prepare(tensor, process_set)
    settings = current().settings
    parse = lambda: reducescatter_arguments(  # noqa: E731
        array, op, prescale_factor, postscale_factor, algorithm, comm.size, settings
    )
    parsed, error = checked(parse, bad_input)
    resolved, requested = parsed or (None, None)
    # An all-reduce's fields under this collective's name, and no device (on_host None).
    fields = allreduce_fields(
        name, array, resolved, prescale_factor, postscale_factor, requested, None, "reducescatter"
    )

    def execute(comm, _):
        transport = select(settings, xp, resolved, array.dtype)
        buf, module = flat_work(array, xp, True, transport)
        row = math.prod(array.shape[1:])
        rows = chunk_bounds(array.shape[0], comm.size)
        bounds = tuple((lo * row, hi * row) for lo, hi in rows)
        scale(module, buf, prescale_factor)
        combined = combined_as(resolved)
        mine = transport.reducescatter(comm, buf, bounds, combined, module, requested)
        if module is xp:  # (a staged part is copied up to the GPU by deliver)
            mine = mine.copy()  # this rank's part alone, not a view that keeps all of `buf`
        scale(module, mine, result_factor(resolved, postscale_factor, comm.size))
        lo, hi = rows[comm.rank]
        return deliver(mine, array, xp, False, (hi - lo, *array.shape[1:]))

    return Plan(fields, set_id(process_set), comm, ranks, error, execute=execute)


reducescatter = synchronous(reducescatter_plan, "reducescatter")


def reducescatter_arguments(array, op, prescale, postscale, algorithm, size: int, settings):
    """Return reducescatter()'s (op, requested algorithm) for `array` over `size` ranks, or
    raise TypeError or ValueError for a bad argument."""
    resolved = resolve_op(op, None)
    check_rows(array, "reducescatter")
    check_reduction(array, resolved, prescale, postscale, size, "reducescatter")
    requested = algorithms.requested_algorithm(algorithm, settings.allreduce_algorithm)
    if requested not in (None, *algorithms.REDUCESCATTER):
        raise ValueError(
            f"reducescatter has no {requested!r} algorithm: use "
            f"{', '.join(algorithms.REDUCESCATTER)} or None"
        )
    return resolved, requested


# ---------------------------------------------------------------------------------------------
# Data movement.


def broadcast_plan(
    tensor, root_rank, *, name=None, process_set=global_process_set, inplace=False
) -> Plan:
    """Return a copy of `tensor` as held by global rank `root_rank`, on every rank.

    With `inplace` (broadcast_()), overwrite `tensor` with the root's and return it.
    """
    comm, ranks, array, xp, bad_input = prepare(tensor, process_set)

    def parse():
        if inplace:
            check_writable(array, "broadcast_")
        return root_index(root_rank, ranks)

    root, error = checked(parse, bad_input)
    fields = array_fields("broadcast", name, array, root_rank=root_rank)

    def execute(comm, _):
        transport = select(current().settings, xp)
        buf, _module = flat_work(array, xp, not inplace, transport)
        transport.broadcast(comm, buf, root)
        return deliver(buf, array, xp, inplace)

    return Plan(fields, set_id(process_set), comm, ranks, error, execute=execute)


broadcast = synchronous(broadcast_plan, "broadcast")
broadcast_ = synchronous(broadcast_plan, "broadcast_", inplace=True)


def allgather_plan(tensor, *, name=None, process_set=global_process_set) -> Plan:
    """Return every rank's `tensor` concatenated along dimension 0, in rank order.

    Dimension 0 may differ between ranks; the other dimensions and the dtype must match.
    """
    comm, ranks, array, xp, bad_input = prepare(tensor, process_set)
    _, error = checked(lambda: check_rows(array, "allgather"), bad_input)
    fields = array_fields("allgather", name, array, trailing=True)

    def execute(comm, rows):
        transport = select(current().settings, xp)
        buf, module = flat_work(array, xp, False, transport)
        row = math.prod(array.shape[1:])
        counts = [r * row for r in rows]
        out = result_buffer(module, xp, sum(counts), array.dtype)
        transport.allgatherv(comm, buf, out, counts)
        return deliver(out, array, xp, False, (sum(rows), *array.shape[1:]))

    payload = array.shape[0] if array.ndim else 0
    return Plan(fields, set_id(process_set), comm, ranks, error, payload=payload, execute=execute)


allgather = synchronous(allgather_plan, "allgather")


def allgather_into_plan(out, rows, *, name=None, process_set=global_process_set) -> Plan:
    """Gather, in place, the rows that every rank holds at its own place in `out`.

    `out` has the whole result's shape on every rank; this rank's `rows` rows already sit after
    those of the ranks before it, and the other ranks' rows are written around them. No new
    array and no copy: what a sharded optimizer needs to gather its updated shards.
    """
    comm, ranks, array, xp, bad_input = prepare(out, process_set)

    def parse():
        check_gather_into(array, rows)
        check_writable(array, "allgather_into")

    _, error = checked(parse, bad_input)
    fields = array_fields("allgather_into", name, array)

    def execute(comm, counts):
        check_gathered_rows(counts, array.shape[0])
        transport = select(current().settings, xp)
        buf, module = flat_work(array, xp, False, transport)
        row = math.prod(array.shape[1:])
        transport.allgatherv(comm, None, buf, [c * row for c in counts])
        return deliver(buf, array, xp, True)

    payload = rows if isinstance(rows, int) else 0
    return Plan(fields, set_id(process_set), comm, ranks, error, payload=payload, execute=execute)


allgather_into = synchronous(allgather_into_plan, "allgather_into")


def check_gather_into(array, rows) -> None:
    """Raise ValueError where allgather_into() cannot gather this rank's `rows` into `array`."""
    check_rows(array, "allgather_into")
    if not isinstance(rows, int) or not 0 <= rows <= array.shape[0]:
        raise ValueError(f"rows must be an int in 0..{array.shape[0]}, got {rows!r}")


def alltoall_plan(tensor, splits=None, *, name=None, process_set=global_process_set) -> Plan:
    """Send rows `splits[i]` of `tensor`'s dimension 0 to rank i; return what arrives, in order.

    Without `splits` dimension 0 is split evenly and must divide by the number of ranks.

    Returns:
        The received array, or `(received, received_splits)` when `splits` was given.
    """
    comm, ranks, array, xp, bad_input = prepare(tensor, process_set)

    def parse():
        check_rows(array, "alltoall")
        return parse_splits(splits, array.shape[0], comm.size)

    send_splits, error = checked(parse, bad_input)
    fields = array_fields("alltoall", name, array, trailing=True, splits_given=splits is not None)

    def execute(comm, rows):
        received_splits = received_splits_of(comm, send_splits, splits, rows)
        transport = select(current().settings, xp)
        buf, module = flat_work(array, xp, False, transport)
        row = math.prod(array.shape[1:])
        send_counts, recv_counts = (send_splits * row).tolist(), (received_splits * row).tolist()
        out = result_buffer(module, xp, int(received_splits.sum()) * row, array.dtype)
        transport.alltoallv(comm, buf, send_counts, out, recv_counts)
        received = deliver(out, array, xp, False, (int(received_splits.sum()), *array.shape[1:]))
        if splits is None:
            return received
        return received, received_splits.astype(np.int32)

    # Without splits, the agreement brings every rank's rows (received_splits_of).
    payload = None if splits is not None else (array.shape[0] if array.ndim else 0)
    return Plan(fields, set_id(process_set), comm, ranks, error, payload=payload, execute=execute)


alltoall = synchronous(alltoall_plan, "alltoall")


def received_splits_of(comm, send_splits: np.ndarray, splits, rows) -> np.ndarray:
    """Return the rows each rank sends this one: without `splits`, every rank's `rows` (the
    plans' payloads) divided by the ranks; with them, told over MPI (collective on `comm`)."""
    if splits is None:
        return np.asarray(rows, dtype=np.int64) // comm.size
    received = np.empty(comm.size, dtype=np.int64)
    comm.Alltoall(send_splits, received)
    return received


# ---------------------------------------------------------------------------------------------
# Synchronization and Python objects.


def barrier(*, process_set=global_process_set) -> None:
    """Wait until every rank of the process set reaches this call (hvd.barrier()'s first half)."""
    comm, ranks = communicator(process_set)
    run_now(
        Plan(
            {"collective": "barrier"},
            set_id(process_set),
            comm,
            ranks,
            execute=lambda comm, _: select(current().settings, np).barrier(comm),
        )
    )


def broadcast_object(obj, root_rank=0, *, name=None, process_set=global_process_set):
    """Return the picklable `obj` of global rank `root_rank`, on every rank."""
    comm, ranks = communicator(process_set)
    root, error = checked(lambda: root_index(root_rank, ranks))
    fields = {"collective": "broadcast_object", "name": name, "root_rank": root_rank}
    execute = lambda comm, _: comm.bcast(obj, root=root)  # noqa: E731
    return run_now(Plan(fields, set_id(process_set), comm, ranks, error, execute=execute))


def allgather_object(obj, *, name=None, process_set=global_process_set) -> list:
    """Return the list of every rank's picklable `obj`, in rank order."""
    comm, ranks = communicator(process_set)
    fields = {"collective": "allgather_object", "name": name}
    execute = lambda comm, _: comm.allgather(obj)  # noqa: E731
    return run_now(Plan(fields, set_id(process_set), comm, ranks, execute=execute))
