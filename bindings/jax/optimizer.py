"""DistributedOptimizer for optax: average the gradient pytree over the ranks, then update.

The gradients travel as one grouped all-reduce (one fused buffer per dtype), described by the
training layer's ReductionSettings, in one host call: eagerly, or inside a jitted train step as
one XLA custom call (host.py). With backward_passes_per_step=k the gradients of k calls accumulate
locally, as optax.MultiSteps accumulates them, and every k-th call reduces their sum and
updates; the others return zero updates.
"""

import functools
from typing import Any, NamedTuple

import optax

import horovodlite as core
import jax
import jax.numpy as jnp
from horovodlite.process_sets import global_process_set
from horovodlite.training import ReductionSettings, reduce_gradients

from .compression import Compression
from .host import like, packed, run_on_host, traced
from .mpi_ops import allreduce_arrays, allreduce_into

__all__ = ["DistributedOptimizer", "DistributedState"]


class DistributedState(NamedTuple):
    """A DistributedOptimizer's state when it accumulates (backward_passes_per_step > 1)."""

    inner_state: Any  # the wrapped transformation's state
    accumulated: Any  # the sum of this step's gradients so far, like the parameters
    passes: jax.Array  # the backward passes accumulated so far in this step (int32)


def _allreduce_tree(grads, settings: ReductionSettings, name=None):
    """Return the pytree `grads` reduced over the ranks as `settings` say (inside jit too).

    The leaves that travel are compressed, go as one grouped all-reduce in one host call (inside
    a trace the small ones packed into one array per dtype), then are decompressed. Alone in its
    process set a rank sends nothing and compresses nothing: its gradients stay as they are.
    """
    leaves, treedef = jax.tree.flatten(grads)
    prefix = name or "DistributedOptimizer"

    def reduce(tensors: list) -> list:
        if not tensors:
            return []
        what = "DistributedOptimizer's all-reduce"
        wires = [settings.compression.compress(t) for t in tensors]
        tensors = [wire for wire, _ in wires]
        if traced(tensors):  # small gradients as one argument per dtype
            tensors, unpack = packed(tensors)
        else:
            unpack = list
        # The core's synchronous all-reduce (one fused buffer per dtype, run at once; one array
        # takes the short path of small messages): the callback waits for it anyway, and the
        # engine's queue would add its round trip.
        args = (prefix, settings.reduce_kwargs, len(tensors) > 1)
        host = functools.partial(allreduce_arrays, *args)
        into = functools.partial(allreduce_into, *args)
        reduced = unpack(run_on_host(what, host, tensors, lambda: [like(t) for t in tensors], into))
        return [settings.compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, wires)]

    reduced = reduce_gradients(leaves, settings, reduce=reduce, scale=lambda t, f: t * f)
    return jax.tree.unflatten(treedef, reduced)


def DistributedOptimizer(
    optimizer,
    compression=Compression.none,
    backward_passes_per_step: int = 1,
    op=core.Average,
    gradient_predivide_factor: float = 1.0,
    process_set=global_process_set,
    name=None,
) -> optax.GradientTransformationExtraArgs:
    """Return `optimizer` (any optax.GradientTransformation) updating on the ranks' average.

    `update(grads, state, params)` all-reduces the gradient pytree (op Average or Sum), then
    runs the wrapped update; it works eagerly and inside a jitted train step. With
    `backward_passes_per_step=k` the gradients of k calls are summed locally (as in Horovod:
    divide each pass's loss by k for their mean) and every k-th call reduces and updates; the
    others return zero updates and keep the wrapped state. The state is then a DistributedState;
    with k=1 it is the wrapped transformation's own.

    Args:
        optimizer: the optax transformation to wrap.
        compression: Compression.none, .fp16 or .bf16 on the wire.
        op: Average (default) or Sum.
        gradient_predivide_factor: with Average, divide before the sum and multiply after.
        process_set: the ranks that average their gradients.
        name: the base of the all-reduce's request name.

    Raises:
        ValueError, TypeError: bad arguments (ReductionSettings), before any communication.
        NotImplementedError: op=Adasum.
    """
    settings = ReductionSettings.from_arguments(locals())
    if settings.op == core.Adasum:
        raise NotImplementedError(
            "horovodlite.jax's DistributedOptimizer does not support op=Adasum (it combines "
            "updates, not gradients): use op=hvd.Average or hvd.Sum"
        )
    inner = optax.with_extra_args_support(optimizer)
    passes = settings.backward_passes_per_step
    if passes == 1:

        def update(grads, state, params=None, **extra):
            return inner.update(_allreduce_tree(grads, settings, name), state, params, **extra)

        return optax.GradientTransformationExtraArgs(inner.init, update)

    def init(params) -> DistributedState:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return DistributedState(inner.init(params), zeros, jnp.zeros((), jnp.int32))

    def update(grads, state: DistributedState, params=None, **extra):
        accumulated = jax.tree.map(jnp.add, state.accumulated, grads)
        count = state.passes + 1

        def step():
            reduced = _allreduce_tree(accumulated, settings, name)
            updates, inner_state = inner.update(reduced, state.inner_state, params, **extra)
            zeros = jax.tree.map(jnp.zeros_like, accumulated)
            return updates, DistributedState(inner_state, zeros, jnp.zeros_like(count))

        def wait():
            zeros = jax.tree.map(jnp.zeros_like, grads)
            return zeros, DistributedState(state.inner_state, accumulated, count)

        if not traced([count]):  # eagerly: no cond, whose traced branches would compile
            return step() if int(count) == passes else wait()
        # Every rank counts alike, so every rank takes the same branch and its collectives.
        return jax.lax.cond(count == passes, step, wait)

    return optax.GradientTransformationExtraArgs(init, update)
