"""JAX arrays on the host: how a collective reaches the core, eagerly or inside a trace.

The core works on numpy arrays. Outside any JAX transformation a collective views its arrays as
numpy (`np.asarray` of a CPU jax.Array shares its buffer where JAX allows) and hands the results
back with `jax.device_put`. Under `jax.jit`, `jax.grad` or `lax` control flow the same host function
runs as an ordered `io_callback`: XLA keeps ordered callbacks in program order, within one
computation and across calls, so every rank meets its collectives in the order it traced them,
as outside jit. A collective's output shape must then be known when it is traced.

JAX dispatches a jitted computation and returns before it has run: an eager collective first
waits for every ordered callback already dispatched (`jax.effects_barrier()`), or a jitted
step's collectives, running on XLA's thread, could meet this one's in another order on another
rank. An ordered callback cannot be batched: under `jax.vmap` a collective raises a ValueError
that says so, whatever the order of vmap and jit.
"""

from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np

import jax
from jax.custom_batching import custom_vmap
from jax.experimental import io_callback
from jax.extend.core import find_top_trace

__all__ = ["traced", "run_on_host", "host_arrays", "refuse_in_trace", "like"]

# The trace that holds when no transformation is active, as JAX names it at import (eagerly).
_EAGER = type(find_top_trace(()))

Host = Callable[..., Sequence[np.ndarray]]


def traced(values=()) -> bool:
    """Return whether a JAX transformation traces `values` (or the current code, for none).

    Inside `jax.jit` every value is staged, constants included: the answer is the current
    trace's, not only whether a value is a Tracer.
    """
    return type(find_top_trace(tuple(values))) is not _EAGER


def like(array) -> jax.ShapeDtypeStruct:
    """Return the shape and dtype of `array`, as a traced collective declares its outputs."""
    return jax.ShapeDtypeStruct(np.shape(array), array.dtype)


def host_arrays(arrays) -> list:
    """Return `arrays` as numpy arrays, after every collective JAX has already dispatched."""
    jax.effects_barrier()
    return [np.asarray(a) for a in arrays]


def run_on_host(
    what: str,
    host: Host,
    arrays: Sequence,
    outputs: Optional[Callable[[], Sequence[jax.ShapeDtypeStruct]]] = None,
) -> list:
    """Run `host(*numpy arrays) -> numpy arrays` on `arrays`; return its results as jax.Arrays.

    Args:
        what: the collective, as errors name it.
        host: the function that calls the core; it runs on every rank in the same order.
        arrays: its inputs: jax.Arrays, or tracers of them under a transformation.
        outputs: under a trace, returns the shapes and dtypes of host's results (an eager call
            takes them from the results, so shapes that depend on other ranks are fine there).
    """
    if not traced(arrays):
        # device_put, not jnp.asarray: the same array, without jnp.asarray's slower copy.
        return [jax.device_put(r) for r in host(*host_arrays(arrays))]
    return _ordered_callback(what, host, list(arrays), list(outputs()))


def _ordered_callback(what: str, host: Host, arrays: list, outputs: list) -> list:
    def on_host(*values):
        results = host(*[np.asarray(v) for v in values])
        # XLA takes exactly the declared dtypes: a 0-d result may come back as a numpy scalar.
        return [np.asarray(r, dtype=o.dtype) for r, o in zip(results, outputs)]

    @custom_vmap
    def call(*values):
        return io_callback(on_host, outputs, *values, ordered=True)

    @call.def_vmap
    def _batched(axis_size, in_batched, *values):
        raise ValueError(
            f"horovodlite.jax: {what} cannot run under jax.vmap: a collective is one ordered "
            "call on every rank and cannot be batched; call it on the whole batched array "
            "outside vmap"
        )

    return list(call(*arrays))


def refuse_in_trace(what: str, why: str, values=()) -> None:
    """Raise TypeError if a JAX transformation traces `values` (or the current code).

    Raises:
        TypeError: `what` has no traced form, for the reason `why`.
    """
    if traced(values):
        raise TypeError(
            f"horovodlite.jax: {what} cannot run inside jax.jit or another JAX transformation: "
            f"{why}"
        )
