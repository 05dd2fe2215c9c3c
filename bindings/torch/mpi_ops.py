"""The collectives on torch tensors: synchronous, in-place, asynchronous and grouped forms.

Tensors are handed to the core as they are where torch's gloo or NCCL moves them
(horovodlite/tensor_plans.py: all-reduce, broadcast, all-gather, all-to-all, reduce-scatter),
else as zero-copy views (tensors.py); no algorithm lives here. The out-of-place synchronous
collectives are differentiable: each backward runs the core's gradient of that collective
(horovodlite/training/collective_gradients.py), the gradient of the sum of the ranks' losses
(`torch.autograd.Function.apply` takes its arguments by position only).
"""

import functools

import numpy as np

import horovodlite as core
import torch
from horovodlite.asynchronous import (
    grouped_tensor_allgather_async,
    grouped_tensor_allreduce_async,
    grouped_tensor_reducescatter_async,
    tensor_allreduce_async,
    tensor_plan_async,
)
from horovodlite.grouped import (
    grouped_tensor_allgather,
    grouped_tensor_allreduce,
    grouped_tensor_reducescatter,
)
from horovodlite.plan import run_now
from horovodlite.process_sets import global_process_set
from horovodlite.small_allreduce import tensor_allreduce
from horovodlite.tensor_plans import (
    tensor_allgather_plan,
    tensor_allreduce_now,
    tensor_alltoall_plan,
    tensor_broadcast_plan,
    tensor_reducescatter_plan,
)
from horovodlite.training import collective_gradients, reduce_kwargs

from .compression import Compression
from .tensors import TORCH_TENSORS, TensorView, on_default_stream, ordered_for_caller

__all__ = [
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "sparse_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
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


class Handle:
    """The pending result of an asynchronous collective on tensors."""

    def __init__(self, core_handle, finish):
        self._core, self._finish = core_handle, finish

    def done(self) -> bool:
        return self._core.done()

    def wait(self):
        return self._finish(self._core.wait())

    # Horovod's sparse_allreduce_async returns a function that waits: scripts call handle().
    __call__ = wait


def poll(handle: Handle) -> bool:
    """Return whether `handle`'s collective has finished."""
    return handle.done()


def synchronize(handle: Handle):
    """Wait for `handle`'s collective and return its tensor (or raise its error)."""
    return handle.wait()


def _data(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`, detached where autograd records (the collectives' results are new tensors, or
    written into it in place, where autograd's version counter is moved on by hand)."""
    return tensor.detach() if tensor.requires_grad else tensor


def _gradients(rule, grads, *args, **kwargs) -> list:
    """Return the core's gradient `rule` of a collective, run on the torch gradients `grads`
    (at once, in the backward pass's order, on its stream: blocking collectives, not the
    engine's): as they are where the core can (collective_gradients.tensor_gradients), else
    through their views."""
    grads = [g.contiguous() for g in grads]
    data = [_data(g) for g in grads]
    results = collective_gradients.tensor_gradients(rule, TORCH_TENSORS, data, *args, **kwargs)
    if results is not None:
        return results
    views = [TensorView(g) for g in grads]
    results = rule([v.array for v in views], *args, blocking=True, **kwargs)()
    return [v.to_tensor(r) for v, r in zip(views, results)]


def _save_inputs(ctx, args: dict, tensors) -> None:
    """Keep the forward's inputs where the op's gradient reads them (Min, Max, Product)."""
    ctx.args = args
    ctx.save_for_backward(*(tensors if args["op"] in collective_gradients.NEEDS_INPUTS else ()))


def _graph_needed(tensors) -> bool:
    """Return whether autograd records a collective on `tensors` (some input needs a gradient).

    Where none does, the forward runs without the autograd Function, whose bookkeeping is a
    large part of a small all-reduce (docs/torch.md): the result is the same, a tensor with no
    gradient.
    """
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _saved_inputs(ctx):
    """Return the inputs _save_inputs kept, as core arrays, or None."""
    return [TensorView(x.detach()).array for x in ctx.saved_tensors] or None


# -- all-reduce -------------------------------------------------------------------------------
# Each public form keeps Horovod's signature (scripts pass these arguments by position), turns
# its reduce arguments into one mapping, and hands it on by keyword.


def _allreduce_one_async(tensor, *, name, args: dict, inplace: bool) -> Handle:
    """Start an all-reduce of `tensor`; return a Handle (a backward pass makes one a gradient).

    On torch's gloo or NCCL the tensor itself travels (asynchronous.tensor_allreduce_async), on
    any stream: the engine's work on its GPU's default stream waits for the caller's
    (`_for_the_engine`), and the result is ordered for the caller's stream.
    """
    data = _data(tensor)
    _for_the_engine([data])
    handle = tensor_allreduce_async(data, TORCH_TENSORS, name, inplace, args)
    if handle is not None:
        finish = functools.partial(_as_it_is, tensor) if inplace else ordered_for_caller
        return Handle(handle, finish)
    view = TensorView(tensor)
    if inplace:
        # (allreduce_async itself: allreduce_async_ would pass every argument on once more)
        handle = core.allreduce_async(view.array, name=name, inplace=True, **args)
        return Handle(handle, view.write_back)
    return Handle(core.allreduce_async(view.array, name=name, **args), view.to_tensor)


def _allreduce_async(tensors: list, *, name, args: dict, inplace: bool) -> Handle:
    """Start one fused all-reduce of `tensors` (a group); return a Handle of their list.

    As _allreduce_one_async, the tensors themselves travel where they can, all or none.
    """
    data = [_data(tensor) for tensor in tensors]
    _for_the_engine(data)
    handle = grouped_tensor_allreduce_async(data, TORCH_TENSORS, name, inplace, args)
    if handle is not None:
        if inplace:
            return Handle(handle, lambda _: [_as_it_is(t, None) for t in tensors])
        return Handle(handle, _ordered_each)
    views = [TensorView(t) for t in tensors]
    finish = [v.write_back if inplace else v.to_tensor for v in views]
    handle = core.grouped_allreduce_async(
        [v.array for v in views], name=name, inplace=inplace, **args
    )
    return Handle(handle, lambda results: [f(r) for f, r in zip(finish, results)])


def _as_it_is(tensor, result) -> torch.Tensor:
    """Finish an in-place all-reduce whose tensor travelled as it is: `result` is its data."""
    torch.autograd.graph.increment_version(tensor)  # (as torch's own in-place ops: write_back)
    return ordered_for_caller(tensor)


def _allreduce_now(tensor, *, name, args: dict, inplace: bool = False) -> torch.Tensor:
    # On torch's gloo or NCCL the tensor itself travels (small_allreduce.tensor_allreduce)
    data = _data(tensor)
    out = tensor_allreduce(data, TORCH_TENSORS, name, inplace, args)
    if out is None and (data.is_cuda or not data.is_contiguous()):
        # (a factor, a process set, or another layout such as channels_last: the engine's
        # tensor way, at once; a contiguous host tensor's view costs no copy, and this second
        # look-up would cost every call that MPI moves)
        out = tensor_allreduce_now(data, TORCH_TENSORS, name, inplace, args)
    if out is not None:
        if inplace:  # (its version moves on, as with torch's own in-place ops: write_back)
            torch.autograd.graph.increment_version(tensor)
            return tensor
        return out
    view = TensorView(tensor)
    if inplace:
        return view.write_back(core.allreduce_(view.array, name=name, **args))
    return view.to_tensor(core.allreduce(view.array, name=name, **args))


def _grouped_allreduce_now(tensors, *, name, args: dict, inplace: bool = False) -> list:
    """Run grouped_allreduce on `tensors`: as they are on torch's gloo or NCCL (all or none;
    on the caller's stream, whose own kept buffer the batch uses), else as views."""
    results = grouped_tensor_allreduce([_data(t) for t in tensors], TORCH_TENSORS, name, inplace,
                                       args)  # fmt: skip
    if results is not None:
        if not inplace:
            return results
        for tensor in tensors:  # (versions move on, as with torch's own in-place ops)
            torch.autograd.graph.increment_version(tensor)
        return list(tensors)
    return _grouped_now(core.grouped_allreduce, tensors, inplace=inplace, name=name, **args)


def _grouped_now(collective, tensors, *, inplace: bool = False, **kwargs) -> list:
    """Run the core's blocking grouped `collective` on `tensors`; return the results as tensors
    (written into `tensors` themselves where `inplace`)."""
    views = [TensorView(t) for t in tensors]
    if inplace:  # (only the all-reduce has an in-place form)
        kwargs["inplace"] = True
    results = collective([v.array for v in views], **kwargs)
    return [(v.write_back if inplace else v.to_tensor)(r) for v, r in zip(views, results)]


def allreduce_async(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """Start an all-reduce of `tensor` into a new tensor; return a Handle."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    return _allreduce_one_async(tensor, name=name, args=args, inplace=False)


def allreduce_async_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """Start an in-place all-reduce of `tensor`; return a Handle."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    return _allreduce_one_async(tensor, name=name, args=args, inplace=True)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, args):
        _save_inputs(ctx, args, [tensor])
        return _allreduce_now(tensor, name=name, args=args)

    @staticmethod
    def backward(ctx, grad):
        rule = collective_gradients.allreduce_gradients
        (result,) = _gradients(rule, [grad], _saved_inputs(ctx), **ctx.args)
        return result, None, None


def allreduce(
    tensor,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> torch.Tensor:
    """Return the reduction of `tensor` over the ranks (differentiable).

    Args mirror horovodlite.allreduce; `compression` casts the tensor for the wire.
    """
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(tensor)
    if _graph_needed([compressed]):
        return compression.decompress(_Allreduce.apply(compressed, name, args), ctx)
    return compression.decompress(_allreduce_now(compressed, name=name, args=args), ctx)


def allreduce_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> torch.Tensor:
    """All-reduce `tensor` in place and return it."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    return _allreduce_now(tensor, name=name, args=args, inplace=True)


def grouped_allreduce_async(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    inplace=False,
) -> Handle:
    """Start an all-reduce of every tensor in `tensors` (fused); return a Handle of the list."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    return _allreduce_async(list(tensors), name=name, args=args, inplace=inplace)


def grouped_allreduce_async_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """In-place grouped_allreduce_async()."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    return _allreduce_async(list(tensors), name=name, args=args, inplace=True)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, args, *tensors):
        _save_inputs(ctx, args, tensors)
        # (As views: results that travelled as they are would be torch views of one buffer,
        # which autograd forbids a custom Function's outputs to be modified in place.)
        return tuple(_grouped_now(core.grouped_allreduce, tensors, name=name, **args))

    @staticmethod
    def backward(ctx, *grads):
        rule = collective_gradients.allreduce_gradients
        return (None, None, *_gradients(rule, grads, _saved_inputs(ctx), **ctx.args))


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
    """Return the reductions of `tensors`, all-reduced as one fused buffer (differentiable)."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    compressed = [compression.compress(t) for t in tensors]
    wires = [t for t, _ in compressed]
    if _graph_needed(wires):
        results = _GroupedAllreduce.apply(name, args, *wires)
    else:
        results = _grouped_allreduce_now(wires, name=name, args=args)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed)]


def grouped_allreduce_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> list:
    """All-reduce every tensor in `tensors` in place, as one fused buffer; return them."""
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    return _grouped_allreduce_now(list(tensors), name=name, args=args, inplace=True)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set) -> Handle:
    """Start an all-reduce of a sparse COO tensor by allgathering its indices and values."""
    op = core.ops.resolve_op(op, None)
    if op not in (core.Average, core.Sum):
        raise ValueError(f"sparse all-reduce supports Average and Sum, got {op.name}")
    sparse = tensor.coalesce()
    indices = TensorView(sparse.indices().t().contiguous())
    values = TensorView(sparse.values().contiguous())
    handle = core.grouped_allgather_async(
        [indices.array, values.array], name=name, process_set=process_set
    )

    def finish(results):
        all_indices = indices.to_tensor(results[0]).t()
        all_values = values.to_tensor(results[1])
        if op == core.Average:
            all_values = all_values / (process_set or global_process_set).size()
        return torch.sparse_coo_tensor(all_indices, all_values, sparse.shape).coalesce()

    return Handle(handle, finish)


# -- allgather, broadcast, alltoall, reduce-scatter ------------------------------------------
# Each tries the core's plan of the tensor as it is first (tensor_plans.py), then its view. The
# blocking forms run on the caller's thread and stream; the engine runs on each GPU's default
# stream, which `_for_the_engine` orders after the caller's.


def _for_the_engine(tensors: list) -> None:
    """Before tensors go to the engine as they are: make each GPU's default stream, where the
    engine's work runs, wait for what the caller's stream has queued, where the two differ (a
    tensor made on a side stream; a wait on the GPU, not on the host), and keep the tensor's
    memory from reuse until the default stream is done with it."""
    for tensor in tensors:
        if tensor.is_cuda and not on_default_stream(tensor):
            default = torch.cuda.default_stream(tensor.device)
            default.wait_stream(torch.cuda.current_stream(tensor.device))
            tensor.record_stream(default)


def _submitted(plan, data: torch.Tensor, finish=ordered_for_caller) -> Handle:
    """Hand a tensor's plan to the engine; return its Handle (`finish` orders the result for
    the caller's stream)."""
    _for_the_engine([data])
    return Handle(tensor_plan_async(plan), finish)


def _ordered_each(results: list) -> list:
    return [ordered_for_caller(result) for result in results]


def _written(tensor: torch.Tensor) -> torch.Tensor:
    """Finish an in-place collective that wrote into `tensor`: its version moves on, as with
    torch's own in-place ops, so autograd refuses a backward pass that saved the old values."""
    torch.autograd.graph.increment_version(tensor)
    return tensor


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Start an allgather along dimension 0; return a Handle."""
    data = _data(tensor)
    plan = tensor_allgather_plan(data, TORCH_TENSORS, name, process_set)
    if plan is not None:
        return _submitted(plan, data)
    view = TensorView(tensor)
    return Handle(
        core.allgather_async(view.array, name=name, process_set=process_set), view.to_tensor
    )


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        plan = tensor_allgather_plan(_data(tensor), TORCH_TENSORS, name, process_set)
        if plan is not None:
            return run_now(plan)
        view = TensorView(tensor)
        return view.to_tensor(core.allgather(view.array, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad):
        rule = collective_gradients.allgather_gradients
        (result,) = _gradients(rule, [grad], [ctx.rows], process_set=ctx.process_set)
        return result, None, None


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Return every rank's `tensor` concatenated along dimension 0 (differentiable)."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    """Start an allgather of every tensor in `tensors`; return a Handle of the list."""
    data = [_data(t) for t in tensors]
    _for_the_engine(data)
    handle = grouped_tensor_allgather_async(data, TORCH_TENSORS, name, process_set)
    if handle is not None:
        return Handle(handle, _ordered_each)
    views = [TensorView(t) for t in tensors]
    handle = core.grouped_allgather_async(
        [v.array for v in views], name=name, process_set=process_set
    )
    return Handle(handle, lambda results: [v.to_tensor(r) for v, r in zip(views, results)])


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        data = [_data(t) for t in tensors]
        results = grouped_tensor_allgather(data, TORCH_TENSORS, name, process_set)
        if results is not None:
            return tuple(results)
        return tuple(_grouped_now(core.grouped_allgather, tensors, name=name,
                                  process_set=process_set))  # fmt: skip

    @staticmethod
    def backward(ctx, *grads):
        rule = collective_gradients.allgather_gradients
        return (None, None, *_gradients(rule, grads, ctx.rows, process_set=ctx.process_set))


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list:
    """Return the allgather of every tensor in `tensors` (differentiable)."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Start a broadcast from `root_rank` into a new tensor; return a Handle."""
    data = _data(tensor)
    plan = tensor_broadcast_plan(data, TORCH_TENSORS, root_rank, name, process_set, False)
    if plan is not None:
        return _submitted(plan, data)
    view = TensorView(tensor)
    handle = core.broadcast_async(view.array, root_rank, name=name, process_set=process_set)
    return Handle(handle, view.to_tensor)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Start an in-place broadcast from `root_rank`; return a Handle."""
    data = _data(tensor)
    plan = tensor_broadcast_plan(data, TORCH_TENSORS, root_rank, name, process_set, True)
    if plan is not None:
        return _submitted(plan, data, lambda _: ordered_for_caller(_written(tensor)))
    view = TensorView(tensor)
    handle = core.broadcast_async_(view.array, root_rank, name=name, process_set=process_set)
    return Handle(handle, view.write_back)


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        plan = tensor_broadcast_plan(_data(tensor), TORCH_TENSORS, root_rank, name, process_set,
                                     False)  # fmt: skip
        if plan is not None:
            return run_now(plan)
        view = TensorView(tensor)
        result = core.broadcast(view.array, root_rank, name=name, process_set=process_set)
        return view.to_tensor(result)

    @staticmethod
    def backward(ctx, grad):
        rule = collective_gradients.broadcast_gradients
        (result,) = _gradients(rule, [grad], ctx.root_rank, process_set=ctx.process_set)
        return result, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Return `root_rank`'s `tensor` on every rank (differentiable)."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Overwrite `tensor` with `root_rank`'s, in place; return it."""
    plan = tensor_broadcast_plan(_data(tensor), TORCH_TENSORS, root_rank, name, process_set, True)
    if plan is not None:
        run_now(plan)
        return _written(tensor)
    view = TensorView(tensor)
    result = core.broadcast_(view.array, root_rank, name=name, process_set=process_set)
    return view.write_back(result)


def _splits_array(splits):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return splits.detach().cpu().numpy()
    return np.asarray(splits)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Start an alltoall; synchronize() returns the output, or (output, received_splits)."""
    data = _data(tensor)
    plan = tensor_alltoall_plan(data, TORCH_TENSORS, _splits_array(splits), name, process_set)
    if plan is not None:

        def received(result):
            if splits is None:
                return ordered_for_caller(result)
            return ordered_for_caller(result[0]), torch.from_numpy(result[1])

        return _submitted(plan, data, received)
    view = TensorView(tensor)
    handle = core.alltoall_async(
        view.array, _splits_array(splits), name=name, process_set=process_set
    )

    def finish(result):
        if splits is None:
            return view.to_tensor(result)
        return view.to_tensor(result[0]), torch.from_numpy(result[1])

    return Handle(handle, finish)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        size = (process_set or global_process_set).size()
        send = _splits_array(splits)
        if send is None and tensor.dim() > 0 and tensor.shape[0] % size == 0:
            send = np.full(size, tensor.shape[0] // size, dtype=np.int64)
        # Explicit splits give back the received splits, which the backward pass needs; an
        # indivisible tensor still goes in without them, so the core reports it on every rank.
        plan = tensor_alltoall_plan(_data(tensor), TORCH_TENSORS, send, name, process_set)
        if plan is not None:
            out, received = run_now(plan)
        else:
            view = TensorView(tensor)
            out, received = core.alltoall(view.array, send, name=name, process_set=process_set)
            out = view.to_tensor(out)
        ctx.received, ctx.process_set = received, process_set
        return out, torch.from_numpy(received)

    @staticmethod
    def backward(ctx, grad, _):
        rule = collective_gradients.alltoall_gradients
        (result,) = _gradients(rule, [grad], ctx.received, process_set=ctx.process_set)
        return result, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send `splits[i]` rows to rank i (differentiable).

    Returns the received tensor, or `(received, received_splits)` when `splits` is given.
    """
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def _reducescatter_async(tensors: list, *, name, args: dict, grouped: bool) -> Handle:
    """Start one reduce-scatter of `tensors` (a single one, or a group); return a Handle."""
    data = [_data(t) for t in tensors]
    if not grouped:
        plan = tensor_reducescatter_plan(data[0], TORCH_TENSORS, name, args)
        if plan is not None:
            return _submitted(plan, data[0])
    else:
        _for_the_engine(data)
        handle = grouped_tensor_reducescatter_async(data, TORCH_TENSORS, name, args)
        if handle is not None:
            return Handle(handle, _ordered_each)
    views = [TensorView(t) for t in tensors]
    if not grouped:
        handle = core.reducescatter_async(views[0].array, name=name, **args)
        return Handle(handle, views[0].to_tensor)
    handle = core.grouped_reducescatter_async([v.array for v in views], name=name, **args)
    return Handle(handle, lambda results: [v.to_tensor(r) for v, r in zip(views, results)])


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
    return _reducescatter_async([tensor], name=name, args=args, grouped=False)


def _reducescatter_gradients(ctx, grads) -> list:
    rule = collective_gradients.reducescatter_gradients
    return _gradients(rule, grads, _saved_inputs(ctx), **ctx.args)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, args):
        _save_inputs(ctx, args, [tensor])
        plan = tensor_reducescatter_plan(_data(tensor), TORCH_TENSORS, name, args)
        if plan is not None:
            return run_now(plan)
        view = TensorView(tensor)
        return view.to_tensor(core.reducescatter(view.array, name=name, **args))

    @staticmethod
    def backward(ctx, grad):
        return _reducescatter_gradients(ctx, [grad])[0], None, None


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, args, *tensors):
        _save_inputs(ctx, args, tensors)
        results = grouped_tensor_reducescatter([_data(t) for t in tensors], TORCH_TENSORS, name,
                                               args)  # fmt: skip
        if results is not None:
            return tuple(results)
        return tuple(_grouped_now(core.grouped_reducescatter, tensors, name=name, **args))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *_reducescatter_gradients(ctx, grads))


def reducescatter(
    tensor,
    name=None,
    compression=Compression.none,
    op=core.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> torch.Tensor:
    """Reduce `tensor` over the ranks; return this rank's rows of dimension 0 (differentiable)."""
    args = reduce_kwargs(op, None, prescale_factor, postscale_factor, process_set)
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(_Reducescatter.apply(compressed, name, args), ctx)


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
    return _reducescatter_async(list(tensors), name=name, args=args, grouped=True)


def grouped_reducescatter(
    tensors,
    name=None,
    op=core.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> list:
    """Return the reduce-scatter of every tensor in `tensors`."""
    args = reduce_kwargs(op, None, prescale_factor, postscale_factor, process_set)
    return list(_GroupedReducescatter.apply(name, args, *tensors))


def join(device=-1) -> int:
    """Join: contribute zeros to all-reduces until every rank has joined; return the last rank.

    `device` is accepted for Horovod compatibility; horovodlite needs no device here.
    """
    return core.join()


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank of the process set reaches this call."""
    core.barrier(process_set=process_set)
