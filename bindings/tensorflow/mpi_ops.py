"""The collectives as TensorFlow ops: eagerly, inside `tf.function`, and in TF1 graphs.

Each collective hands its arrays to the core through op_runner.py, which runs them eagerly or
as graph ops in an order that cannot deadlock. Each differentiable collective's gradient is the
core's (horovodlite/training/collective_gradients.py): the gradient of the sum of the ranks'
losses, run as one more op (`_gradient_op`).
"""

import itertools

import numpy as np

import horovodlite as core
import tensorflow as tf
from horovodlite.ops import ReduceOp
from horovodlite.process_sets import global_process_set, process_set_ranks
from horovodlite.training import collective_gradients, reduce_kwargs, run_per_dtype, started

from .compression import Compression
from .op_runner import (
    differentiable,
    request_name,
    rows_shape,
    run_local,
    run_op,
    set_size,
)

__all__ = [
    "allreduce",
    "grouped_allreduce",
    "allgather",
    "grouped_allgather",
    "broadcast",
    "broadcast_",
    "alltoall",
    "reducescatter",
    "grouped_reducescatter",
    "join",
    "barrier",
    "size_op",
    "rank_op",
    "local_size_op",
    "local_rank_op",
    "process_set_included_op",
]


# -- all-reduce -----------------------------------------------------------------------------


def _allreduce_start(arrays, *, name, args: dict, blocking: bool):
    """Start the all-reduce of `arrays`, one fused buffer per dtype; return its finish."""
    if blocking:
        return started(True, core.grouped_allreduce, None, list(arrays), name=name, **args)

    def start(group, suffix):
        group_name = name if name is None or suffix is None else f"{name}.{suffix}"
        return core.grouped_allreduce_async(group, name=group_name, **args)

    # Each array's slot: its group's handle and its place in the group.
    slots = run_per_dtype(
        arrays, start, lambda handle: zip(itertools.repeat(handle), itertools.count())
    )
    return lambda: _synchronize_slots(slots)


def _synchronize_slots(slots: list) -> list:
    """Wait for every handle among `slots` ((handle, index) pairs); return the results in order."""
    results: dict = {}
    for handle, _ in slots:
        if id(handle) not in results:
            results[id(handle)] = core.synchronize(handle)
    return [results[id(handle)][i] for handle, i in slots]


def _allreduce_dense(tensors, *, name, args: dict) -> list:
    """All-reduce dense tensors (any dtypes) as one op; differentiable."""
    if not tensors:
        return []

    def forward(xs, name=name):
        request = request_name(name, kind="allreduce")
        return run_op(
            lambda *arrays, blocking: _allreduce_start(
                arrays, name=request, args=args, blocking=blocking
            ),
            xs,
            touts=[x.dtype for x in xs],
            shapes=[x.shape for x in xs],
            kind="Allreduce",
        )

    def backward(dys, xs):
        return _reduction_gradient(collective_gradients.allreduce_gradients, dys, xs, args)

    return differentiable(forward, backward, tensors)


def _gradient_op(rule, dys, xs, *, extra=(), kind: str, **options) -> list:
    """Return ops that run the core's gradient `rule` of a collective with inputs `xs`.

    The op's inputs are the upstream gradients `dys` and the tensors `extra`, which reach
    `rule(grads, *extra_arrays, name=..., **options)` as arrays after the gradients.
    """
    request = request_name(None, kind=kind)
    count = len(dys)

    def start(*arrays, blocking):
        grads, extra_arrays = list(arrays[:count]), arrays[count:]
        return rule(grads, *extra_arrays, name=request, blocking=blocking, **options)

    return run_op(
        start,
        [*dys, *extra],
        touts=[x.dtype for x in xs],
        shapes=[x.shape for x in xs],
        kind=kind.title().replace("_", ""),
    )


def _reduction_gradient(rule, dys, xs, args: dict) -> list:
    """The gradient of an all-reduce or reduce-scatter: `rule` reads the inputs for some ops."""
    if args["op"] not in collective_gradients.NEEDS_INPUTS:
        return _gradient_op(rule, dys, xs, kind=f"{rule.__name__}", **args)
    count = len(xs)

    def with_inputs(grads, *inputs, **options):
        return rule(grads, list(inputs[:count]), **options)

    return _gradient_op(with_inputs, dys, xs, extra=xs, kind=rule.__name__, **args)


def _allreduce_sparse(slices, *, name, args: dict):
    """All-reduce `tf.IndexedSlices` as Horovod does: allgather the values and the indices.

    Average divides the gathered values by the size as Horovod's `values / size` does, so integer
    values average to floats (tf.math.truediv) instead of rounding to zero.
    """
    op = args["op"]
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise NotImplementedError(
            f"tf.IndexedSlices are all-reduced by allgather, which supports Average and Sum, "
            f"got {op.name}: pass sparse_as_dense=True or convert with tf.convert_to_tensor"
        )
    process_set = args["process_set"]
    values, indices = grouped_allgather(
        [slices.values, slices.indices], name=name, process_set=process_set
    )
    if op == ReduceOp.AVERAGE:
        values = tf.math.truediv(values, tf.cast(set_size(process_set), values.dtype))
    scale = args["prescale_factor"] * args["postscale_factor"]
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(
    tensor,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
):
    """Return the reduction of `tensor` over the ranks of `process_set` (differentiable).

    Args:
        tensor: a tensor, or `tf.IndexedSlices` (all-gathered: Average and Sum only, no
            prescale or postscale factor; Average of integer values gives floats).
        average: deprecated; True is op=Average, False op=Sum.
        device_dense, device_sparse, ignore_name_scope: accepted for Horovod; unused.
        compression: Compression.none, .fp16 or .bf16: the dtype on the wire.
        op: Average (default), Sum, Min, Max or Product.
        prescale_factor, postscale_factor: multiply the input before, the result after.
        name: the name that matches this request across ranks (default: automatic).
        process_set: the ranks taking part.
    """
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    if isinstance(tensor, tf.IndexedSlices):
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError(
                "tf.IndexedSlices are all-reduced by allgather, which takes no prescale_factor "
                f"or postscale_factor (got {prescale_factor} and {postscale_factor}), as in "
                "Horovod: scale the values yourself, or pass a dense tensor"
            )
        return _allreduce_sparse(tensor, name=name, args=args)
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    (reduced,) = _allreduce_dense([compressed], name=name, args=args)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(
    tensors,
    average=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
    name=None,
) -> list:
    """Return allreduce() of every tensor in `tensors`, the dense ones fused in one op.

    Tensors of several dtypes are fine: each dtype travels as one fused buffer.
    """
    args = reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)
    tensors = list(tensors)
    out: list = [None] * len(tensors)
    dense, compressed = [], []
    for i, tensor in enumerate(tensors):
        if isinstance(tensor, tf.IndexedSlices):
            sparse_name = None if name is None else f"{name}.sparse.{i}"
            out[i] = _allreduce_sparse(tensor, name=sparse_name, args=args)
        else:
            dense.append(i)
            compressed.append(compression.compress(tf.convert_to_tensor(tensor)))
    reduced = _allreduce_dense([t for t, _ in compressed], name=name, args=args)
    for i, result, (_, ctx) in zip(dense, reduced, compressed):
        out[i] = compression.decompress(result, ctx)
    return out


# -- allgather ------------------------------------------------------------------------------


def _by_rows(xs: list, start, backward, *, name, kind: str) -> list:
    """Run `start(arrays, request, blocking)`, a grouped collective along dimension 0 that
    returns its finish (finishing.started), as one op on `xs`.

    The results' dimension 0 is unknown until run (rows_shape); `backward` is their gradient.
    """
    if not xs:
        return []
    for x in xs:
        if x.shape.rank == 0:
            raise ValueError(f"{kind} works on dimension 0, but got a 0-d tensor: reshape it")

    def forward(xs):
        request = request_name(name, kind=kind)
        return run_op(
            lambda *arrays, blocking: start(arrays, request, blocking),
            xs,
            touts=[x.dtype for x in xs],
            shapes=[rows_shape(x) for x in xs],
            kind=kind.title(),
        )

    return differentiable(forward, backward, xs)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Return allgather() of every tensor in `tensors`, as one op (differentiable)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]

    def start(arrays, request, blocking):
        return started(blocking, core.grouped_allgather, core.grouped_allgather_async,
                       list(arrays), name=request, process_set=process_set)  # fmt: skip

    def backward(dys, xs):
        rows = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in xs])
        return _gradient_op(
            collective_gradients.allgather_gradients,
            dys,
            xs,
            extra=[rows],
            kind="allgather_gradients",
            process_set=process_set,
        )

    return _by_rows(tensors, start, backward, name=name, kind="allgather")


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Return every rank's `tensor` concatenated on dimension 0, in rank order.

    Dimension 0 may differ between ranks; the other dimensions and the dtype must match.
    """
    return grouped_allgather([tensor], name=name, process_set=process_set)[0]


# -- broadcast ------------------------------------------------------------------------------


def _broadcast_tensors(tensors, *, root_rank, name, process_set) -> list:
    def forward(xs, name=name):
        request = request_name(name, kind="broadcast")

        def start(*arrays, blocking):
            names = [None if request is None else f"{request}.{i}" for i in range(len(arrays))]
            finishes = [
                started(
                    blocking,
                    core.broadcast,
                    core.broadcast_async,
                    array,
                    root_rank,
                    name=n,
                    process_set=process_set,
                )
                for array, n in zip(arrays, names)
            ]
            return lambda: [finish() for finish in finishes]

        return run_op(
            start,
            xs,
            touts=[x.dtype for x in xs],
            shapes=[x.shape for x in xs],
            kind="Broadcast",
        )

    def backward(dys, xs):
        rule = collective_gradients.broadcast_gradients
        return _gradient_op(
            lambda grads, **options: rule(grads, root_rank, **options),
            dys,
            xs,
            kind="broadcast_gradients",
            process_set=process_set,
        )

    return differentiable(forward, backward, tensors)


def broadcast(
    tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set
):
    """Return global rank `root_rank`'s `tensor` on every rank (differentiable)."""
    (result,) = _broadcast_tensors(
        [tf.convert_to_tensor(tensor)], root_rank=root_rank, name=name, process_set=process_set
    )
    return result


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Overwrite each of `variables` with `root_rank`'s value, in one op; return the variables.

    In a TF1 graph this returns the assign ops, to be run.
    """
    variables = list(variables)
    if not variables:
        return []
    values = _broadcast_tensors(
        [tf.convert_to_tensor(v) for v in variables],
        root_rank=root_rank,
        name=name,
        process_set=process_set,
    )
    return [var.assign(value) for var, value in zip(variables, values)]


# -- alltoall and reduce-scatter ------------------------------------------------------------


def alltoall(
    tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set
):
    """Send rows `splits[i]` of dimension 0 to rank i; return what arrives (differentiable).

    Returns the received tensor, or `(received, received_splits)` (int32) when `splits` is
    given. Without `splits` dimension 0 is split evenly and must divide by the number of ranks.
    A rank may send or receive no rows at all.

    Raises:
        ValueError: `splits` are not integers. Splits that do not add up to dimension 0, or a
            dimension 0 that does not divide evenly, raise tf.errors.InvalidArgumentError on
            every rank (eagerly it is a ValueError too).
        tf.errors.FailedPreconditionError: the ranks' dtypes or trailing shapes differ.
    """
    tensor = tf.convert_to_tensor(tensor)
    given = splits is not None
    split_tensor = tf.convert_to_tensor(splits if given else [], dtype_hint=tf.int32)
    if not split_tensor.dtype.is_integer:
        # ValueError, as Horovod's tf.convert_to_tensor(splits, dtype=tf.int32) raises.
        raise ValueError(
            f"alltoall splits must be integers, got {split_tensor.dtype.name}: pass row counts "
            "as int32 or int64"
        )
    split_tensor = tf.cast(tf.reshape(split_tensor, [-1]), tf.int64)

    def exchange(array, send, request, blocking):
        if not given:
            # Even splits, given explicitly so the received splits come back for the gradient.
            # An indivisible tensor goes in without splits, for the core to report on every rank.
            size = set_size(process_set)
            rows = array.shape[0] if array.ndim else -1
            send = np.full(size, rows // size, np.int64) if rows >= 0 and rows % size == 0 else None
        return started(blocking, core.alltoall, core.alltoall_async, array, send, name=request,
                       process_set=process_set)  # fmt: skip

    received = []

    def forward(xs):
        request = request_name(name, kind="alltoall")
        out, got = run_op(
            lambda array, send, blocking: exchange(array, send, request, blocking),
            [xs[0], split_tensor],
            touts=[xs[0].dtype, tf.int32],
            shapes=[rows_shape(xs[0]), tf.TensorShape([None])],
            kind="Alltoall",
        )
        received.append(got)
        return [out]

    def backward(dys, xs):
        return _gradient_op(
            collective_gradients.alltoall_gradients,
            dys,
            xs,
            extra=[received[-1]],
            kind="alltoall_gradients",
            process_set=process_set,
        )

    (output,) = differentiable(forward, backward, [tensor])
    return (output, received[-1]) if given else output


def _reducescatter(tensors, compression, *, name, args: dict) -> list:
    """Reduce-scatter `tensors` as one op, each compressed on the wire (differentiable)."""
    compressed = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]

    def start(arrays, request, blocking):
        return started(blocking, core.grouped_reducescatter, core.grouped_reducescatter_async,
                       list(arrays), name=request, **args)  # fmt: skip

    def backward(dys, xs):
        return _reduction_gradient(collective_gradients.reducescatter_gradients, dys, xs, args)

    xs = [t for t, _ in compressed]
    results = _by_rows(xs, start, backward, name=name, kind="reducescatter")
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, compressed)]


def grouped_reducescatter(
    tensors,
    device_dense="",
    compression=Compression.none,
    op=ReduceOp.AVERAGE,
    name=None,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> list:
    """Return reducescatter() of every tensor in `tensors`, as one op (differentiable)."""
    args = reduce_kwargs(op, None, prescale_factor, postscale_factor, process_set)
    return _reducescatter(tensors, compression, name=name, args=args)


def reducescatter(
    tensor,
    device_dense="",
    compression=Compression.none,
    op=ReduceOp.AVERAGE,
    name=None,
    process_set=global_process_set,
    ignore_name_scope=False,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Reduce `tensor` over the ranks; return this rank's rows of dimension 0 (differentiable).

    With n rows and k ranks, ranks 0 .. n % k - 1 get n // k + 1 rows, the others n // k.
    """
    args = reduce_kwargs(op, None, prescale_factor, postscale_factor, process_set)
    (result,) = _reducescatter([tensor], compression, name=name, args=args)
    return result


# -- join, barrier and the process facts as ops ---------------------------------------------


def join():
    """Join: contribute zeros to all-reduces until every rank has joined.

    Returns the last rank to join (an int32 tensor, the same on every rank).
    """
    # join() answers the other ranks' collectives until they all join: it blocks by design.
    return run_local(lambda: [np.int32(core.join())], touts=[tf.int32], kind="Join")[0]


def barrier(process_set=global_process_set):
    """Wait until every rank of the process set reaches this op (in a graph: runs it)."""
    request = request_name(None, kind="barrier")

    def start(blocking):
        # An all-reduce, so that in a TF1 graph a barrier is a submit and a wait like every
        # other collective.
        finish = started(blocking, core.allreduce, core.allreduce_async, np.zeros(1, np.int8),
                         op=ReduceOp.SUM, name=request, process_set=process_set)  # fmt: skip
        return lambda: (finish(), [True])[1]

    return run_op(start, [], touts=[tf.bool], shapes=[tf.TensorShape([])], kind="Barrier")[0]


def _fact_op(fact, *, name) -> tf.Tensor:
    """Return an int32 scalar op that gives `fact()` when run."""
    with tf.name_scope(name or "horovodlite"):
        (fact_op,) = run_local(lambda: [np.int32(fact())], touts=[tf.int32], kind="Fact")
        fact_op.set_shape([])
        return fact_op


def size_op(process_set_id=0, name=None):
    """Return an op that gives the number of ranks (of the process set) when run."""
    return _fact_op(lambda: len(process_set_ranks(process_set_id)), name=name)


def rank_op(process_set_id=0, name=None):
    """Return an op that gives this process's rank (in the process set) when run."""

    def rank():
        ranks = process_set_ranks(process_set_id)
        return ranks.index(core.rank()) if core.rank() in ranks else -1

    return _fact_op(rank, name=name)


def local_size_op(name=None):
    """Return an op that gives the number of ranks on this host when run."""
    return _fact_op(core.local_size, name=name)


def local_rank_op(name=None):
    """Return an op that gives this process's rank on its host when run."""
    return _fact_op(core.local_rank, name=name)


def process_set_included_op(process_set_id=0, name=None):
    """Return an op that gives 1 if this process is in the process set, else 0, when run."""
    return _fact_op(lambda: int(core.rank() in process_set_ranks(process_set_id)), name=name)
