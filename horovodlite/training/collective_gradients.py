"""The gradients of the collectives: the one rule that every binding's autograd follows.

A job of n ranks trains on the sum of its ranks' losses, L = L_0 + ... + L_{n-1}, where rank r's
loss reads the collective's output on rank r. That is the loss one process computes over all
ranks' data, so with it n ranks train as one process does on the whole batch (docs/equivalence.md).
The gradient of L with respect to rank s's input therefore adds up, over every rank r, what r's
upstream gradient says about s's input. Each collective's gradient is its adjoint:

- all-reduce, Sum or Average, y = post * reduce(pre * x): G = the sum over the ranks of the
  upstream gradients, and dx = pre * post * G (divided by the set's size for Average).
- all-reduce, Min or Max: G as above, given to the ranks whose pre * x is the extreme, split
  evenly where several ranks hold it (the rule of torch's amax and TensorFlow's reduce_max).
- all-reduce, Product: G times pre * post times the product of the other ranks' pre * x.
- reduce-scatter: as the all-reduce, with G the concatenation of the ranks' upstream gradients
  (rank r's upstream gradient belongs to rank r's rows of the full reduction).
- allgather: the sum over the ranks of the upstream gradient's rows that came from this rank.
- broadcast: on the root, the sum over the ranks of the upstream gradients; zero elsewhere.
- alltoall: the alltoall of the upstream gradient back, with the received splits as splits.

Horovod (0.28.1) averages where this sums for allgather and broadcast, and multiplies Sum's
reduce-scatter gradient by n: its issue #2654. horovodlite keeps Horovod's API and follows the
sum of the losses (docs/equivalence.md, "Collectives inside the model").

Each function takes the upstream gradients on this rank as core arrays (numpy or CuPy), starts
the collectives that their gradient needs, and returns `finish()`, which returns the gradients of
this rank's inputs. A binding converts its tensors, calls one of these and converts back.
With `blocking=True` each collective runs at once, a blocking call in program order
(finishing.py): what torch's and JAX's backward passes and TensorFlow's eager ops use. In
TensorFlow's graphs, with `blocking=False`, the collectives go to the engine (named `name` + a
suffix where given: a TF1 graph's ops run in any order, bindings/tensorflow/op_runner.py).
"""

import functools
from typing import Callable, Optional

import numpy as np

from ..asynchronous import alltoall_async, grouped_allgather_async, grouped_allreduce_async
from ..buffers import array_module
from ..collectives import alltoall
from ..grouped import (
    grouped_allgather,
    grouped_allreduce,
    grouped_tensor_allgather,
    grouped_tensor_allreduce,
)
from ..ops import ReduceOp, result_factor
from ..plan import run_now
from ..process_sets import ProcessSet, global_process_set
from ..state import rank
from ..tensor_kind import TensorKind
from ..tensor_plans import tensor_alltoall_plan
from .finishing import Finish, started

__all__ = [
    "tensor_gradients",
    "allreduce_gradients",
    "reducescatter_gradients",
    "allgather_gradients",
    "broadcast_gradients",
    "alltoall_gradients",
    "NEEDS_INPUTS",
]

# The ops whose gradient reads the forward pass's inputs, not only the upstream gradient.
NEEDS_INPUTS = (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)


def _member(name: Optional[str], suffix: str) -> Optional[str]:
    return None if name is None else f"{name}.{suffix}"


def _grouped_allreduce(blocking: bool, arrays: list, **options) -> Finish:
    return started(blocking, grouped_allreduce, grouped_allreduce_async, arrays, **options)


def _grouped_allgather(blocking: bool, arrays: list, **options) -> Finish:
    return started(blocking, grouped_allgather, grouped_allgather_async, arrays, **options)


def _set(process_set: Optional[ProcessSet]) -> ProcessSet:
    return process_set or global_process_set


def _summed(grads: list, process_set, name, blocking: bool) -> Finish:
    """Start G, the sum over the ranks of the upstream gradients; return its finish."""
    return _grouped_allreduce(
        blocking, grads, op=ReduceOp.SUM, process_set=process_set, name=_member(name, "sum")
    )


def _gathered(grads: list, process_set, name, blocking: bool) -> Finish:
    """Start G, the concatenation of the ranks' upstream gradients of their rows."""
    return _grouped_allgather(blocking, grads, process_set=process_set, name=_member(name, "rows"))


def allreduce_gradients(grads: list, inputs: Optional[list] = None, **reduction) -> Finish:
    """Start the gradient of an all-reduce (or a grouped one) of `inputs`; return its finish.

    Args:
        grads: the upstream gradient of each output on this rank.
        inputs: the forward pass's inputs on this rank; read by Min, Max and Product only.
        reduction: the forward all-reduce's op, prescale_factor, postscale_factor and
            process_set, and name, the base of the requests' names (None: submission order),
            and blocking (see above); _reduction_gradient() lists them with their defaults.

    Raises:
        ValueError: op is Adasum, whose result is no fixed function of one rank's input.
    """
    return _reduction_gradient(_summed, grads, inputs, **reduction)


def reducescatter_gradients(grads: list, inputs: Optional[list] = None, **reduction) -> Finish:
    """Start the gradient of a reduce-scatter (or a grouped one); return its finish.

    Arguments as allreduce_gradients(); `grads` are the gradients of this rank's rows.
    """
    return _reduction_gradient(_gathered, grads, inputs, **reduction)


def tensor_gradients(rule, kind: TensorKind, grads: list, *args, **options):
    """Return the gradient `rule` (one of this module's, with its arguments) run at once on a
    binding's contiguous tensors `grads` as they are, or None where they must go as numpy or CuPy
    views (then the binding runs `rule` on those, blocking).

    The same collectives as the rule's, in the same order, on the tensors where their transport
    moves them (torch's gloo and NCCL: tensor_plans.py, the same agreement and calls as the
    views', so ranks on either way meet):
    - all-reduce and reduce-scatter with Sum or Average: G, the sum or the concatenation of the
      upstream gradients, scaled by the kind where a factor is left (float32 and float64 only:
      a half type's product would round otherwise than its view's `array * factor`);
    - all-gather: G's rows that came from this rank; broadcast: G on the root, zeros elsewhere;
    - all-to-all: the upstream gradient sent back.
    Min, Max and Product need array operations on the forward's inputs: views.
    """
    way = _TENSOR_WAYS.get(rule)
    return None if way is None else way(kind, grads, *args, **options)


def _reduced_tensors(start, kind, grads, inputs=None, *, op, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set, name=None):  # fmt: skip
    """An all-reduce's (`start`: _tensors_summed) or a reduce-scatter's (_tensors_gathered)
    gradient as tensors, for Sum and Average; None otherwise."""
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        return None
    process_set = _set(process_set)
    factor = _sum_factor(op, prescale_factor, postscale_factor, process_set)
    if factor != 1.0 and not all(_scaled_as_arrays(kind, g) for g in grads):
        return None
    upstream = start(kind, grads, process_set, name)
    if upstream is not None and factor != 1.0:
        for g in upstream:
            kind.scale(g, factor)
    return upstream


def _tensors_summed(kind, grads, process_set, name):
    """_summed() of tensors as they are, at once; None where they go as views."""
    options = {"op": ReduceOp.SUM, "process_set": process_set}
    return grouped_tensor_allreduce(grads, kind, _member(name, "sum"), False, options)


def _tensors_gathered(kind, grads, process_set, name):
    """_gathered() of tensors as they are, at once; None where they go as views."""
    return grouped_tensor_allgather(grads, kind, _member(name, "rows"), process_set)


def _allgather_tensors(kind, grads, rows, *, process_set=global_process_set, name=None):
    process_set = _set(process_set)
    summed = _tensors_summed(kind, grads, process_set, name)
    if summed is None:
        return None
    everyone = _row_counts(rows, process_set, name, True)()
    me = process_set.rank()
    starts = everyone[:me].sum(axis=0)
    return [g[start : start + n] for g, start, n in zip(summed, starts, everyone[me])]


def _broadcast_tensors(kind, grads, root_rank, *, process_set=global_process_set, name=None):
    summed = _tensors_summed(kind, grads, _set(process_set), name)
    if summed is not None and rank() != root_rank:
        for g in summed:  # (new tensors: the sum's own results)
            g[...] = 0
    return summed


def _alltoall_tensors(kind, grads, received_splits, *, process_set=global_process_set,
                      name=None):  # fmt: skip
    (grad,) = grads
    plan = tensor_alltoall_plan(grad, kind, received_splits, name, process_set)
    return None if plan is None else [run_now(plan)[0]]


def _scaled_as_arrays(kind: TensorKind, tensor) -> bool:
    """Return whether the kind scales `tensor` as `array * factor` scales its view: float32 and
    float64, one correctly rounded product in either library."""
    described = kind.describe(tensor)
    return described is not None and described[0] in (np.float32, np.float64)


def _reduction_gradient(
    start_upstream: Callable[..., Finish],
    grads: list,
    inputs: Optional[list],
    *,
    op: ReduceOp,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = global_process_set,
    name: Optional[str] = None,
    blocking: bool = False,
) -> Finish:
    """Check `op`, start G (`start_upstream`: _summed or _gathered); return the gradient's finish.

    The check comes first, so an Adasum gradient raises on every rank before any communication.
    """
    if op == ReduceOp.ADASUM:
        raise ValueError(
            "an Adasum all-reduce has no gradient here: Adasum combines the ranks' gradients "
            "(DistributedOptimizer(op=hvd.Adasum)); inside a model use op=hvd.Sum or hvd.Average"
        )
    upstream = start_upstream(grads, process_set, name, blocking)
    return _through_reduction(
        upstream, inputs, op, prescale_factor, postscale_factor, _set(process_set), name, blocking
    )


def _through_reduction(
    upstream: Finish, inputs, op, pre: float, post: float, process_set, name, blocking: bool
) -> Finish:
    """Return the finish of a reduction's gradient, given the finish of G (`upstream`).

    Every op's gradient is pre * post * G times the derivative of the reduction of the
    prescaled inputs z = pre * x with respect to this rank's z.
    """
    scale = pre * post
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        factor = _sum_factor(op, pre, post, process_set)
        return lambda: [_scaled(g, factor) for g in upstream()]
    if inputs is None:
        raise ValueError(f"the gradient of a {op.name} reduction needs the forward's inputs")
    prescaled = [x if pre == 1.0 else x * pre for x in inputs]
    if op == ReduceOp.PRODUCT:
        return _product_gradient(upstream, prescaled, scale, process_set, name, blocking)
    return _extreme_gradient(upstream, prescaled, op, scale, process_set, name, blocking)


def _extreme_gradient(
    upstream: Finish, prescaled: list, op, scale, process_set, name, blocking: bool
) -> Finish:
    """Min or Max: G goes to the ranks that hold the extreme, split evenly between them."""
    extremes = _grouped_allreduce(
        blocking, prescaled, op=op, process_set=process_set, name=_member(name, "extreme")
    )

    def finish() -> list:
        summed, extreme = upstream(), extremes()
        held = [(z == m).astype(g.dtype) for z, m, g in zip(prescaled, extreme, summed)]
        holders = _grouped_allreduce(
            blocking, held, op=ReduceOp.SUM, process_set=process_set,
            name=_member(name, "holders"),
        )()  # fmt: skip
        # Where no rank holds it (a NaN), no rank gets a gradient, rather than 0 / 0.
        return [
            g * scale * h / array_module(c).maximum(c, 1) for g, h, c in zip(summed, held, holders)
        ]

    return finish


def _product_gradient(
    upstream: Finish, prescaled: list, scale, process_set, name, blocking: bool
) -> Finish:
    """Product: G times the product of the other ranks' prescaled inputs (without division,
    so that a zero on one rank still gives the others their gradient)."""
    factors = _grouped_allgather(
        blocking, [z.reshape(1, -1) for z in prescaled], process_set=process_set,
        name=_member(name, "factors"),
    )  # fmt: skip

    def finish() -> list:
        summed, stacks, me = upstream(), factors(), process_set.rank()
        out = []
        for g, stack in zip(summed, stacks):
            xp = array_module(stack)
            others = xp.prod(stack[:me], axis=0) * xp.prod(stack[me + 1 :], axis=0)
            # conj: the gradient of a complex product, as torch and TensorFlow define it.
            out.append(g * scale * xp.conj(others).reshape(g.shape).astype(g.dtype))
        return out

    return finish


def _sum_factor(op, pre: float, post: float, process_set) -> float:
    """The factor on G of a Sum's or an Average's gradient: pre * post, divided by the set's size
    for Average."""
    return result_factor(op, pre * post, process_set.size())


def _scaled(array, factor: float):
    return array if factor == 1.0 else array * factor


def allgather_gradients(
    grads: list,
    rows: list,
    *,
    process_set: Optional[ProcessSet] = global_process_set,
    name: Optional[str] = None,
    blocking: bool = False,
) -> Finish:
    """Start the gradient of an allgather (or a grouped one); return its finish.

    Args:
        grads: the upstream gradient of each gathered output on this rank.
        rows: the number of rows (dimension 0) of each input on this rank.
    """
    process_set = _set(process_set)
    summed = _summed(grads, process_set, name, blocking)
    counts = _row_counts(rows, process_set, name, blocking)

    def finish() -> list:
        summed_grads, everyone = summed(), counts()
        me = process_set.rank()
        starts = everyone[:me].sum(axis=0)
        return [g[start : start + n] for g, start, n in zip(summed_grads, starts, everyone[me])]

    return finish


def _row_counts(rows: list, process_set, name, blocking: bool) -> Finish:
    """Start the gather of every rank's `rows` (on the host, whatever holds the gradients);
    its finish returns them, one row per rank."""
    counts = _grouped_allgather(
        blocking, [np.asarray(rows, dtype=np.int64).reshape(1, -1)], process_set=process_set,
        name=_member(name, "counts"),
    )  # fmt: skip
    return lambda: counts()[0]


def broadcast_gradients(
    grads: list,
    root_rank: int,
    *,
    process_set: Optional[ProcessSet] = global_process_set,
    name: Optional[str] = None,
    blocking: bool = False,
) -> Finish:
    """Start the gradient of a broadcast from global rank `root_rank`; return its finish."""
    summed = _summed(grads, process_set, name, blocking)
    if rank() == root_rank:
        return summed
    return lambda: [array_module(g).zeros_like(g) for g in summed()]


def alltoall_gradients(
    grads: list,
    received_splits,
    *,
    process_set: Optional[ProcessSet] = global_process_set,
    name: Optional[str] = None,
    blocking: bool = False,
) -> Finish:
    """Start the gradient of an alltoall that received `received_splits` rows from each rank.

    `grads` holds the one upstream gradient; the finish returns the one input gradient.
    """
    (grad,) = grads
    back = started(blocking, alltoall, alltoall_async, grad, received_splits,
                    process_set=process_set, name=name)  # fmt: skip
    return lambda: [back()[0]]


# The gradients that run on a binding's tensors as they are (tensor_gradients).
_TENSOR_WAYS = {
    allreduce_gradients: functools.partial(_reduced_tensors, _tensors_summed),
    reducescatter_gradients: functools.partial(_reduced_tensors, _tensors_gathered),
    allgather_gradients: _allgather_tensors,
    broadcast_gradients: _broadcast_tensors,
    alltoall_gradients: _alltoall_tensors,
}
