"""Adasum in a DistributedOptimizer: combine the optimizer's updates, not the gradients.

Horovod's Adasum optimizers (torch's `_DistributedAdasumOptimizer`, TensorFlow's for
`tf.compat.v1.train` optimizers) let each rank take its optimizer step with its own, local
gradient, then combine the ranks' updates with Adasum:

    start = params;  step();  delta = params - start;  params = start + Adasum(delta)

Combining updates rather than gradients is what makes Adasum work with adaptive optimizers
(Adam, LAMB): each rank's update already carries its optimizer's per-parameter scaling, and
Adasum then adds the orthogonal parts of the updates and averages the parallel ones. The
learning rate needs no scaling with the number of ranks (docs/adasum.md).
"""

from typing import Any, Callable

from ..algorithms import is_power_of_two
from ..ops import ReduceOp

__all__ = ["combines_updates", "combine_updates"]


def combines_updates(settings) -> bool:
    """Return whether a DistributedOptimizer with these ReductionSettings reduces its updates.

    True for op=Adasum among two or more ranks: the optimizer then steps on the local gradient
    and Adasum combines the updates. Alone, Adasum is the identity and the optimizer steps as is.
    Call it when the optimizer is built, so a wrong number of ranks fails there, on every rank.

    Raises:
        ValueError: op=Adasum on a process set whose size is not a power of two.
    """
    if settings.op != ReduceOp.ADASUM:
        return False
    size = settings.process_set.size()
    if not is_power_of_two(size):
        raise ValueError(
            f"Adasum needs a power-of-two number of ranks (1, 2, 4, 8, ...), but the process "
            f"set has {size}: run on a power of two, train on a process set of that size, or "
            "use op=Average"
        )
    return not settings.alone()


def combine_updates(
    params: list,
    step: Callable[[], Any],
    *,
    copy: Callable[[Any], Any],
    delta: Callable[[Any, Any], Any],
    reduce: Callable[[list], list],
    assign: Callable[[Any, Any, Any], None],
) -> Any:
    """Run `step()`, then set each parameter to its start plus the Adasum of the ranks' updates.

    Every rank must pass the same parameters in the same order: a parameter the step left
    alone (no gradient on this rank) still takes part, with a zero update.

    Args:
        params: the parameters the step may change.
        step: the wrapped optimizer's step on the local gradients; its result is returned.
        copy: `copy(param)` returns a snapshot of the parameter's value.
        delta: `delta(param, start)` returns the update, the parameter's value minus `start`.
        reduce: `reduce(updates)` all-reduces the list of updates with op=Adasum.
        assign: `assign(param, start, combined)` sets the parameter to start + combined.
    """
    starts = [copy(param) for param in params]
    result = step()
    combined = reduce([delta(param, start) for param, start in zip(params, starts)])
    for param, start, update in zip(params, starts, combined):
        assign(param, start, update)
    return result
