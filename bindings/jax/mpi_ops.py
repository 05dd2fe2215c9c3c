"""The collectives on jax.Arrays: eagerly, inside jax.jit, and differentiable.

Arrays reach the core through numpy (host.py): eagerly at once, and under a JAX trace as XLA
custom calls on XLA's own buffers, so the same call works in both and gives the same result. No
algorithm lives here. The synchronous collectives are differentiable (`jax.custom_vjp`): each
backward runs the core's gradient of that collective
(horovodlite/training/collective_gradients.py), the gradient of the sum of the ranks' losses,
eagerly or as another custom call.

Inside jax.jit an output's shape is fixed when it is traced. Where it depends on other ranks
(allgather of rows that differ between ranks, alltoall) the caller states it (`rows=`,
`received_splits=`), and the collective checks it against what the ranks hold before returning:
a wrong statement raises on every rank. JAX arrays are immutable, so there are no in-place
forms (`allreduce_`, `broadcast_`); the asynchronous forms return handles, which only exist
outside a trace.
"""

import functools
from typing import Callable, Optional

import numpy as np

import horovodlite as core
import jax
import jax.numpy as jnp
from horovodlite.algorithms.scratch import chunk_bounds
from horovodlite.process_sets import ProcessSet, global_process_set
from horovodlite.training import collective_gradients, reduce_kwargs

from .compression import Compression
from .host import (
    follow,
    host_arrays,
    like,
    linked,
    order_token,
    refuse_in_trace,
    run_on_host,
    traced,
)

__all__ = [
    "allreduce",
    "allreduce_async",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_async",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "poll",
    "synchronize",
    "join",
    "barrier",
]


def _set(process_set: Optional[ProcessSet]) -> ProcessSet:
    return process_set or global_process_set


def _arrays(tensors) -> list:
    """Return `tensors` as jax.Arrays; those that are already (tracers too) pass unconverted."""
    return [t if isinstance(t, jax.Array) else jnp.asarray(t) for t in tensors]


# -- differentiation --------------------------------------------------------------------------


def _differentiable(forward: Callable, backward: Callable, xs: list, save: Callable) -> list:
    """Return `forward(xs)` (a list of arrays) with `backward` as its vector-Jacobian product.

    `save(xs, outputs)` returns what the backward pass keeps (a pytree of arrays, or None);
    `backward(saved, cotangents)` returns one cotangent per input, None for no gradient. With
    no transformation active nothing can differentiate: `forward` runs alone, without the
    custom_vjp's cost (about 0.1 ms a call).
    """
    if not traced(xs):
        return forward(xs)
    # The collectives' order travels in tokens (host.py): this one follows the trace's last.

    @jax.custom_vjp
    def collective(token, *xs):
        with linked(token) as link:
            outputs = forward(list(xs))
        return (*link.tokens, *outputs)

    def forward_saving(token, *xs):
        with linked(token) as link:
            outputs = forward(list(xs))
        return (*link.tokens, *outputs), (link.tokens[0], save(list(xs), outputs))

    def backward_of(saved, cotangents):
        token, saved = saved
        after, *cotangents = cotangents
        with linked(token, after) as link:
            grads = backward(saved, cotangents)
        return (link.tokens[0] if link.called else after, *grads)

    collective.defvjp(forward_saving, backward_of)
    token, *outputs = collective(order_token(xs), *xs)
    follow(xs, token)
    return outputs


def _at_once(rule: Callable, *args, **kwargs) -> list:
    """Run the core's gradient `rule` of a collective to its end: its collectives block, in the
    order of the computation (a trace's tokens order them), without the engine's round trip."""
    return rule(*args, blocking=True, **kwargs)()


def _gradients(what: str, finish: Callable, xs: list, cotangents: list, extra=()) -> list:
    """Return the cotangents of `xs` from the core's gradient rule.

    `finish(grads, extra)` runs the rule on numpy arrays (the upstream gradients of the inexact
    inputs' outputs, and the `extra` arrays it reads) and returns their input gradients. Inputs
    of integer or boolean dtype have no gradient (None); every rank has the same dtypes, so
    every rank leaves out the same tensors.
    """
    kept = [i for i, x in enumerate(xs) if jnp.issubdtype(x.dtype, jnp.inexact)]
    out = [None] * len(xs)
    if not kept:
        return out
    count = len(kept)

    def host(*arrays):
        return finish(list(arrays[:count]), list(arrays[count:]))

    grads = [cotangents[i] for i in kept]
    results = run_on_host(
        f"the gradient of {what}", host, grads + list(extra), lambda: [like(xs[i]) for i in kept]
    )
    for i, result in zip(kept, results):
        out[i] = result
    return out


def _reduction(
    what: str, host: Callable, rule: Callable, xs: list, args: dict, shape=like, into=None
):
    """Run an all-reduce or reduce-scatter `host` on `xs`, differentiable by `rule`.

    `shape(x)` gives an output's shape and dtype under a trace (default: the input's); `into`
    is host's in-place form (run_on_host).
    """
    needs_inputs = args["op"] in collective_gradients.NEEDS_INPUTS

    def forward(xs):
        return run_on_host(what, host, xs, lambda: [shape(x) for x in xs], into)

    def backward(saved, cotangents):
        kept = [x for x in (saved or ()) if jnp.issubdtype(x.dtype, jnp.inexact)]

        def finish(grads, inputs):
            return _at_once(rule, grads, inputs or None, **args)

        return _gradients(what, finish, xs, cotangents, kept)

    return _differentiable(forward, backward, xs, lambda xs, _: xs if needs_inputs else None)


# -- all-reduce -------------------------------------------------------------------------------


def _allreduced(tensors: list, name, args: dict, grouped: bool) -> list:
    what = "grouped_allreduce" if grouped else "allreduce"
    rule = collective_gradients.allreduce_gradients
    host = functools.partial(allreduce_arrays, name, args, grouped)
    into = functools.partial(allreduce_into, name, args, grouped)
    return _reduction(what, host, rule, _arrays(tensors), args, into=into)


def allreduce_arrays(name, args: dict, grouped: bool, *arrays) -> list:
    """All-reduce numpy `arrays` (one group if `grouped`, else the only one); return results."""
    if grouped:
        return core.grouped_allreduce(list(arrays), name=name, **args)
    return [core.allreduce(arrays[0], name=name, **args)]


def allreduce_into(name, args: dict, grouped: bool, outs: list, *arrays) -> None:
    """Do allreduce_arrays() in place in `outs` (numpy arrays shaped as `arrays`)."""
    for out, array in zip(outs, arrays):
        if not np.may_share_memory(out, array):  # else XLA lent the input's buffer itself
            np.copyto(out, array)
    if grouped:
        core.grouped_allreduce(outs, name=name, inplace=True, **args)
    else:
        core.allreduce_(outs[0], name=name, **args)


def allreduce(
    tensor,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> jax.Array:
    """Return the reduction of `tensor` over the ranks (differentiable; works inside jax.jit).

    Args mirror horovodlite.allreduce; `compression` casts the array for the wire.
    """
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(jnp.asarray(tensor))
    (result,) = _allreduced([compressed], name, args, grouped=False)
    return compression.decompress(result, ctx)


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> list:
    """Return the reductions of `tensors`, all-reduced as one fused buffer per dtype."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    compressed = [compression.compress(jnp.asarray(t)) for t in tensors]
    if not compressed:
        return []
    results = _allreduced([t for t, _ in compressed], name, args, grouped=True)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed)]


# -- reduce-scatter ---------------------------------------------------------------------------


def _scattered_shape(process_set: ProcessSet) -> Callable:
    """Return the shape of this rank's part of a reduce-scatter, from the input's shape."""
    size, me = process_set.size(), process_set.rank()

    def shape(x):
        if x.ndim == 0:  # rejected by the core on every rank
            return like(x)
        start, stop = chunk_bounds(x.shape[0], size)[me]  # the core's split of the rows
        return jax.ShapeDtypeStruct((stop - start, *x.shape[1:]), x.dtype)

    return shape


def _reducescattered(tensors: list, name, args: dict, grouped: bool) -> list:
    def host(*arrays):
        if grouped:
            return core.grouped_reducescatter(list(arrays), name=name, **args)
        return [core.reducescatter(arrays[0], name=name, **args)]

    what = "grouped_reducescatter" if grouped else "reducescatter"
    rule = collective_gradients.reducescatter_gradients
    shape = _scattered_shape(_set(args["process_set"]))
    return _reduction(what, host, rule, _arrays(tensors), args, shape)


def reducescatter(
    tensor,
    name=None,
    compression=Compression.none,
    op=core.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> jax.Array:
    """Reduce `tensor` over the ranks; return this rank's rows of dimension 0 (differentiable).

    Ranks 0 .. (rows % size) - 1 of the process set get one row more, as in Horovod.
    """
    args = reduce_kwargs(op, None, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(jnp.asarray(tensor))
    (result,) = _reducescattered([compressed], name, args, grouped=False)
    return compression.decompress(result, ctx)


def grouped_reducescatter(
    tensors,
    name=None,
    op=core.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> list:
    """Return the reduce-scatter of every tensor in `tensors` (differentiable)."""
    args = reduce_kwargs(op, None, prescale_factor, postscale_factor, process_set)
    tensors = list(tensors)
    return _reducescattered(tensors, name, args, grouped=True) if tensors else []


# -- allgather --------------------------------------------------------------------------------


def _gathered_rows(x, rows, process_set: ProcessSet) -> int:
    """Return the rows `x`'s allgather will have: the sum of `rows` (every rank's), else size *
    own. Nothing is checked here, on this rank alone: _checked_allgather checks on every rank."""
    own = x.shape[0] if x.ndim else 0
    return process_set.size() * own if rows is None else sum(int(r) for r in rows)


def _checked_allgather(what: str, name, process_set: ProcessSet, totals: list, *arrays) -> list:
    """Allgather `arrays`, whose results must have `totals` rows (fixed when traced).

    Each rank's rows and expected totals travel beside the data, in the same grouped allgather,
    so every rank sees every rank's and raises the same error when one rank's are wrong.
    """
    count = len(arrays)
    mine = [[a.shape[0] if a.ndim else 0 for a in arrays] + list(totals)]
    table = np.asarray(mine, dtype=np.int64)
    *results, table = core.grouped_allgather([*arrays, table], name=name, process_set=process_set)
    held, expected = table[:, :count], table[:, count:]
    wrong = np.flatnonzero((expected != held.sum(axis=0)).any(axis=1))
    if wrong.size:
        ranks = process_set.ranks
        rank, k = ranks[wrong[0]], int(np.flatnonzero(expected[wrong[0]] != held.sum(0))[0])
        raise ValueError(
            f"{what} inside jax.jit: the output's rows are fixed when traced, but rank {rank} "
            f"expected {int(expected[wrong[0], k])} rows of tensor {k} and the ranks {ranks} "
            f"hold {held[:, k].tolist()} ({int(held[:, k].sum())} in all): pass "
            f"rows={held[:, k].tolist()} where the ranks' rows differ"
        )
    return results


def _allgathered(tensors: list, name, process_set, rows: list, grouped: bool) -> list:
    process_set = _set(process_set)
    what = "grouped_allgather" if grouped else "allgather"
    xs = _arrays(tensors)
    totals = [_gathered_rows(x, r, process_set) for x, r in zip(xs, rows)]

    def host(*arrays):
        if grouped:
            return core.grouped_allgather(list(arrays), name=name, process_set=process_set)
        return [core.allgather(arrays[0], name=name, process_set=process_set)]

    def forward(xs):
        if not traced(xs) and all(r is None for r in rows):
            return run_on_host(what, host, xs)
        # Inside jit, or eagerly with rows stated: the statement is checked on every rank.
        checked = functools.partial(_checked_allgather, what, name, process_set, totals)
        shapes = [(t, *x.shape[1:]) if x.ndim else () for t, x in zip(totals, xs)]
        return run_on_host(
            what,
            checked,
            xs,
            lambda: [jax.ShapeDtypeStruct(s, x.dtype) for s, x in zip(shapes, xs)],
        )

    def backward(_, cotangents):
        own = [x.shape[0] if x.ndim else 0 for x in xs if jnp.issubdtype(x.dtype, jnp.inexact)]

        def finish(grads, _):
            rule = collective_gradients.allgather_gradients
            return _at_once(rule, grads, own, process_set=process_set)

        return _gradients(what, finish, xs, cotangents)

    return _differentiable(forward, backward, xs, lambda xs, _: None)


def allgather(tensor, name=None, process_set=global_process_set, *, rows=None) -> jax.Array:
    """Return every rank's `tensor` concatenated along dimension 0 (differentiable).

    Args:
        rows: dimension 0 of every rank's tensor, in the process set's rank order. Inside
            jax.jit the output's shape is fixed when traced: without `rows`, every rank must
            have this rank's rows. A wrong shape raises on every rank. Outside jit the rows may
            differ freely; `rows`, if given, is checked there too.
    """
    return _allgathered([tensor], name, process_set, [rows], grouped=False)[0]


def grouped_allgather(tensors, name=None, process_set=global_process_set, *, rows=None) -> list:
    """Return the allgather of every tensor in `tensors` (differentiable).

    `rows` is None or, per tensor, None or every rank's rows of it (see allgather()).
    """
    tensors = list(tensors)
    rows = [None] * len(tensors) if rows is None else list(rows)
    if len(rows) != len(tensors):
        raise ValueError(f"expected rows for each of the {len(tensors)} tensors, got {len(rows)}")
    return _allgathered(tensors, name, process_set, rows, grouped=True) if tensors else []


# -- broadcast --------------------------------------------------------------------------------


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> jax.Array:
    """Return `root_rank`'s `tensor` on every rank (differentiable; root_rank is global)."""
    process_set = _set(process_set)
    xs = _arrays([tensor])

    def host(array):
        return [core.broadcast(array, root_rank, name=name, process_set=process_set)]

    def forward(xs):
        return run_on_host("broadcast", host, xs, lambda: [like(xs[0])])

    def backward(_, cotangents):
        def finish(grads, _):
            rule = collective_gradients.broadcast_gradients
            return _at_once(rule, grads, root_rank, process_set=process_set)

        return _gradients("broadcast", finish, xs, cotangents)

    return _differentiable(forward, backward, xs, lambda xs, _: None)[0]


# -- alltoall ---------------------------------------------------------------------------------


def _static_splits(what: str, splits, size: int) -> Optional[np.ndarray]:
    if splits is None:
        return None
    if isinstance(splits, jax.core.Tracer):
        raise TypeError(
            f"{what} inside jax.jit: splits must be known when traced (a list or numpy array, "
            "not a traced array): the output's shape depends on them"
        )
    values = np.asarray(splits).astype(np.int64).reshape(-1)
    if values.size != size:
        raise ValueError(f"{what}: expected one split per rank ({size}), got {values.size}")
    return values


def _traced_splits(x, splits, received_splits, size: int) -> tuple:
    """Return what this rank sends to and expects from each rank, fixed when traced.

    An even split that does not divide sends -1 rows: the check before the data moves names it
    on every rank, as the core does outside jit.
    """
    rows = x.shape[0] if x.ndim else 0
    send = _static_splits("alltoall", splits, size)
    expect = _static_splits("alltoall", received_splits, size)
    if send is None:
        even = np.full(size, rows // size, dtype=np.int64)
        send = even if x.ndim and rows % size == 0 else np.full(size, -1, dtype=np.int64)
        expect = even if expect is None else expect
    elif expect is None:
        raise TypeError(
            "alltoall inside jax.jit with splits needs received_splits= too: the rows this rank "
            "receives from each rank, which fix the output's shape when traced"
        )
    return rows, send, expect


def _checked_alltoall(name, process_set: ProcessSet, rows: int, send, expect, array) -> list:
    """Alltoall `array` after every rank has checked every rank's splits (one small allgather)."""
    size = process_set.size()
    mine = np.asarray([[rows, *send, *expect]], dtype=np.int64)
    table = core.allgather(mine, name=None if name is None else f"{name}.splits",
                           process_set=process_set)  # fmt: skip
    held, sent, expected = table[:, 0], table[:, 1 : size + 1], table[:, size + 1 :]
    ranks = process_set.ranks
    undivided = np.flatnonzero((sent < 0).any(axis=1))
    if undivided.size:
        i = undivided[0]
        raise ValueError(
            f"alltoall without splits divides dimension 0 evenly, but rank {ranks[i]}'s "
            f"{held[i]} rows do not divide by {size} ranks: pass splits= (and, inside jax.jit, "
            "received_splits=)"
        )
    wrong = np.flatnonzero((expected != sent.T).any(axis=1))
    if wrong.size:
        j = wrong[0]
        raise ValueError(
            f"alltoall inside jax.jit: the output's rows are fixed when traced, but rank "
            f"{ranks[j]} expected {expected[j].tolist()} rows from the ranks {ranks}, which send "
            f"it {sent[:, j].tolist()}: received_splits must hold what each rank sends this rank"
        )
    out, received = core.alltoall(array, send, name=name, process_set=process_set)
    return [out, received.astype(np.int32)]


def alltoall(
    tensor, splits=None, name=None, process_set=global_process_set, *, received_splits=None
):
    """Send `splits[i]` rows to rank i (differentiable).

    Returns the received array, or `(received, received_splits)` when `splits` is given.

    Args:
        received_splits: the rows this rank receives from each rank; needed inside jax.jit
            with `splits` (the output's shape is fixed when traced) and checked on every rank.
            Without `splits`, dimension 0 is split evenly (and must divide by the set's size).
    """
    process_set = _set(process_set)
    size = process_set.size()
    xs = _arrays([tensor])

    def forward(xs):
        (x,) = xs
        if traced(xs):
            rows, send, expect = _traced_splits(x, splits, received_splits, size)
            host = functools.partial(_checked_alltoall, name, process_set, rows, send, expect)
            shape = (int(expect.sum()), *x.shape[1:]) if x.ndim else ()
            outputs = [
                jax.ShapeDtypeStruct(shape, x.dtype),
                jax.ShapeDtypeStruct((size,), np.int32),
            ]
            return run_on_host("alltoall", host, xs, lambda: outputs)
        send = _static_splits("alltoall", splits, size)
        if send is None and x.ndim and x.shape[0] % size == 0:
            send = np.full(size, x.shape[0] // size, dtype=np.int64)

        def host(array):
            # Explicit splits give back the received splits, which the backward pass needs; an
            # indivisible array still goes in without them, so the core raises on every rank.
            out, received = core.alltoall(array, send, name=name, process_set=process_set)
            return [out, received.astype(np.int32)]

        return run_on_host("alltoall", host, xs)

    def backward(received, cotangents):
        def finish(grads, extra):
            rule = collective_gradients.alltoall_gradients
            return _at_once(rule, grads, extra[0], process_set=process_set)

        return _gradients("alltoall", finish, xs, cotangents[:1], [received])

    out, received = _differentiable(forward, backward, xs, lambda _, outputs: outputs[1])
    return out if splits is None else (out, received)


# -- asynchronous forms -----------------------------------------------------------------------


class Handle:
    """The pending result of an asynchronous collective on jax.Arrays."""

    def __init__(self, core_handle, finish: Callable, inputs: list):
        # The inputs stay referenced until the collective is done: the core reads their buffers.
        self._core, self._finish, self._inputs = core_handle, finish, inputs

    def done(self) -> bool:
        return self._core.done()

    def wait(self):
        result = self._finish(self._core.wait())
        self._inputs = None
        return result


def _host_inputs(what: str, tensors) -> list:
    why = "it returns a handle, which a trace cannot hold; call the synchronous form inside"
    refuse_in_trace(what, why, tensors)
    return host_arrays(_arrays(tensors))


def _started(start: Callable, tensors, grouped: bool, *args, **kwargs) -> Handle:
    """Start the core's `start` on `tensors` as host arrays (all of them if `grouped`, else the
    only one); return the Handle whose wait() gives jax.Arrays."""
    arrays = _host_inputs(start.__name__, tensors)
    handle = start(arrays if grouped else arrays[0], *args, **kwargs)
    return Handle(handle, _each if grouped else jnp.asarray, arrays)


def _each(results) -> list:
    return [jnp.asarray(r) for r in results]


def poll(handle: Handle) -> bool:
    """Return whether `handle`'s collective has finished."""
    return handle.done()


def synchronize(handle: Handle):
    """Wait for `handle`'s collective and return its result (or raise its error)."""
    return handle.wait()


def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """Start an all-reduce of `tensor`; return a Handle (outside jax.jit only)."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    return _started(core.allreduce_async, [tensor], False, name=name, **args)


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """Start an all-reduce of every tensor in `tensors` (fused); return a Handle of the list."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    return _started(core.grouped_allreduce_async, tensors, True, name=name, **args)


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Start an allgather along dimension 0; return a Handle."""
    return _started(core.allgather_async, [tensor], False, name=name, process_set=process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    """Start an allgather of every tensor in `tensors`; return a Handle of the list."""
    start = core.grouped_allgather_async
    return _started(start, tensors, True, name=name, process_set=process_set)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Start a broadcast from global rank `root_rank`; return a Handle."""
    start = core.broadcast_async
    return _started(start, [tensor], False, root_rank, name=name, process_set=process_set)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Start an alltoall; synchronize() returns the output, or (output, received_splits)."""
    arrays = _host_inputs("alltoall_async", [tensor])
    send = None if splits is None else np.asarray(splits)
    handle = core.alltoall_async(arrays[0], send, name=name, process_set=process_set)

    def finish(result):
        if splits is None:
            return jnp.asarray(result)
        return jnp.asarray(result[0]), jnp.asarray(result[1])

    return Handle(handle, finish, arrays)


def reducescatter_async(
    tensor,
    name=None,
    op=core.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> Handle:
    """Start a reduce-scatter along dimension 0; return a Handle."""
    args = reduce_kwargs(op, None, prescale_factor, postscale_factor, process_set)
    return _started(core.reducescatter_async, [tensor], False, name=name, **args)


def grouped_reducescatter_async(
    tensors,
    name=None,
    op=core.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> Handle:
    """Start a reduce-scatter of every tensor in `tensors`; return a Handle of the list."""
    args = reduce_kwargs(op, None, prescale_factor, postscale_factor, process_set)
    return _started(core.grouped_reducescatter_async, tensors, True, name=name, **args)


# -- join and barrier -------------------------------------------------------------------------


def join(device=-1) -> int:
    """Join: contribute zeros to all-reduces until every rank has joined; return the last rank.

    `device` is accepted for Horovod compatibility. Outside jax.jit only.
    """
    refuse_in_trace("join", "it waits for the other ranks' later collectives")
    host_arrays(())  # after this rank's dispatched collectives
    return core.join()


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank of the process set reaches this call (inside jax.jit too)."""

    def host():
        core.barrier(process_set=process_set)
        return []

    run_on_host("barrier", host, [], lambda: [])
