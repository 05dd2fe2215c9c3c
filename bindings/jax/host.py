"""JAX arrays on the host: how a collective reaches the core, eagerly or inside a trace.

The core works on numpy arrays. Outside any JAX transformation a collective views its arrays as
numpy (`np.asarray` of a CPU jax.Array shares its buffer where JAX allows) and hands the results
back with `jax.device_put`. Under `jax.jit`, `jax.grad` or `lax` control flow the same host function
runs as an ordered `io_callback`: XLA keeps ordered callbacks in program order, within one
computation and across calls, so every rank meets its collectives in the order it traced them,
as outside jit. A collective's output shape must then be known when it is traced. An
io_callback's arrays pass through JAX's own copies on the way in and out, which cost more than
the collective itself from a few hundred KiB: from BUFFERS_FROM bytes on CPU the data travels in
XLA's buffers instead (a `buffer_callback`, where the all-reduce works in place), between two
small ordered callbacks that keep it in program order.

JAX dispatches a jitted computation and returns before it has run: an eager collective first
waits for every ordered callback already dispatched (`jax.effects_barrier()`), or a jitted
step's collectives, running on XLA's thread, could meet this one's in another order on another
rank. An ordered callback cannot be batched: under `jax.vmap` a collective raises a ValueError
that says so, whatever the order of vmap and jit.

A collective's error inside a trace reaches the caller as JAX's JaxRuntimeError, which keeps only
its text; `collective_failure` finds the horovodlite error behind one (hvd.elastic.run needs it).
"""

from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np

import jax
import jax.numpy as jnp
from horovodlite.exceptions import HorovodLiteError
from jax.custom_batching import custom_vmap
from jax.experimental import io_callback
from jax.experimental.buffer_callback import buffer_callback
from jax.extend.core import find_top_trace

__all__ = [
    "traced",
    "run_on_host",
    "host_arrays",
    "refuse_in_trace",
    "like",
    "packed",
    "collective_failure",
]

# The trace that holds when no transformation is active, as JAX names it at import (eagerly).
_EAGER = type(find_top_trace(()))

Host = Callable[..., Sequence[np.ndarray]]
Into = Callable[..., None]

# The last horovodlite error raised by a collective inside a trace (on XLA's thread).
_last_failure: Optional[HorovodLiteError] = None

# A traced callback pays JAX for each of its arrays (a device_put, conversions and checks on the
# way in and out); an array smaller than this costs less to copy into one buffer inside XLA.
PACK_BELOW = 64 * 1024  # bytes
# From this many bytes in and out, a traced collective's data travels in XLA's own buffers: below
# it the two extra ordered callbacks cost more than JAX's copies save (docs/jax.md, measured).
BUFFERS_FROM = 256 * 1024


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
    into: Optional[Into] = None,
) -> list:
    """Run `host(*numpy arrays) -> numpy arrays` on `arrays`; return its results as jax.Arrays.

    Args:
        what: the collective, as errors name it.
        host: the function that calls the core; it runs on every rank in the same order.
        arrays: its inputs: jax.Arrays, or tracers of them under a transformation.
        outputs: under a trace, returns the shapes and dtypes of host's results (an eager call
            takes them from the results, so shapes that depend on other ranks are fine there).
        into: `into(outs, *numpy arrays)` does what host does, writing the results into `outs`
            (writable arrays shaped as `outputs`, one per input, maybe the inputs' own memory):
            used where a traced collective's data travels in XLA's buffers, so the core can work
            in place. Without it host's results are copied.
    """
    if not traced(arrays):
        # device_put, not jnp.asarray: the same array, without jnp.asarray's slower copy.
        return [jax.device_put(r) for r in host(*host_arrays(arrays))]
    return _ordered_callback(what, host, into, list(arrays), list(outputs()))


def packed(arrays: Sequence) -> tuple:
    """Return `arrays` with the small ones of each dtype concatenated, and how to split back.

    For elementwise collectives (all-reduce) under a trace: arrays under PACK_BELOW bytes travel
    as one flat array per dtype, larger ones as they are. Returns `(wires, unpack)`, where
    `unpack(results of wires)` gives one result per array of `arrays`, in their shapes.
    """
    small: dict = {}
    for i, a in enumerate(arrays):
        if a.size * a.dtype.itemsize < PACK_BELOW:
            small.setdefault(a.dtype, []).append(i)
    groups = [members for members in small.values() if len(members) > 1]
    packed_ones = {i for members in groups for i in members}
    wires, where = [], {}  # where[i]: (the wire of arrays[i], its offset there or None)
    for i, a in enumerate(arrays):
        if i not in packed_ones:
            where[i] = (len(wires), None)
            wires.append(a)
    for members in groups:
        offset = 0
        for i in members:
            where[i] = (len(wires), offset)
            offset += arrays[i].size
        wires.append(jnp.concatenate([arrays[i].reshape(-1) for i in members]))

    def unpack(results: Sequence) -> list:
        out = []
        for i, a in enumerate(arrays):
            k, offset = where[i]
            out.append(results[k] if offset is None else
                       results[k][offset : offset + a.size].reshape(a.shape))  # fmt: skip
        return out

    return wires, unpack


def _ordered_callback(
    what: str, host: Host, into: Optional[Into], arrays: list, outputs: list
) -> list:
    def remembering(run: Callable, *args):
        try:
            return run(*args)
        except HorovodLiteError as exc:
            _remember(exc)
            raise

    def on_host(*values):
        results = remembering(host, *[np.asarray(v) for v in values])
        # XLA takes exactly the declared dtypes: a 0-d result may come back as a numpy scalar.
        return [np.asarray(r, dtype=o.dtype) for r, o in zip(results, outputs)]

    def into_buffers(context, outs, ticket, *values):
        outs, values = [np.asarray(o) for o in outs], [np.asarray(v) for v in values]
        if into is not None:
            remembering(into, outs, *values)
            return
        for out, result in zip(outs, remembering(host, *values)):
            result = np.asarray(result)
            if result.shape != out.shape:  # as io_callback checks (copyto would broadcast)
                raise ValueError(f"{what}: a result has shape {result.shape}, not {out.shape}")
            np.copyto(out, result, casting="unsafe")

    through_buffers = _through_buffers(arrays, outputs)

    @custom_vmap
    def call(*values):
        if not through_buffers:
            return io_callback(on_host, outputs, *values, ordered=True)
        # The data goes in and out of XLA's own buffers (buffer_callback, no copy by JAX); two
        # small ordered callbacks around it keep it in program order: the first after every
        # earlier ordered effect, the second (it reads a result) before every later one.
        ticket = io_callback(_ticket, _TICKET, ordered=True)
        # An in-place host writes over its inputs: XLA lends it an input's buffer as the
        # output's where the input is not needed after (else it copies it in first).
        aliases = {k + 1: k for k in range(len(outputs))} if into is not None else None
        results = buffer_callback(
            into_buffers, outputs, has_side_effect=True, input_output_aliases=aliases
        )(ticket, *values)
        first = next(r for r in results if r.size)
        io_callback(_ticket, _TICKET, first.reshape(-1)[0], ordered=True)
        return results

    @call.def_vmap
    def _batched(axis_size, in_batched, *values):
        raise ValueError(
            f"horovodlite.jax: {what} cannot run under jax.vmap: a collective is one ordered "
            "call on every rank and cannot be batched; call it on the whole batched array "
            "outside vmap"
        )

    return list(call(*arrays))


_TICKET = jax.ShapeDtypeStruct((), np.int32)


def _ticket(*_) -> np.ndarray:
    return np.zeros((), np.int32)


def _through_buffers(arrays: list, outputs: list) -> bool:
    """Whether a traced collective's data travels in XLA's buffers (buffer_callback).

    From BUFFERS_FROM bytes in and out, on CPU (numpy views the buffers there), with a
    non-empty result for the closing callback to read.
    """
    if jax.default_backend() != "cpu" or not any(o.size for o in outputs):
        return False
    size = sum(a.size * a.dtype.itemsize for a in arrays)
    return size + sum(o.size * np.dtype(o.dtype).itemsize for o in outputs) >= BUFFERS_FROM


def _remember(failure: HorovodLiteError) -> None:
    global _last_failure
    _last_failure = failure


def collective_failure(error: BaseException) -> Optional[HorovodLiteError]:
    """Return the horovodlite error behind `error`, or None if there is none.

    Eagerly that is `error` itself. Inside jax.jit JAX raises a JaxRuntimeError that ends with the
    text of the collective's error: the last one a traced collective raised, if the texts match.
    """
    if isinstance(error, HorovodLiteError):
        return error
    failure = _last_failure
    if isinstance(error, jax.errors.JaxRuntimeError) and failure is not None:
        if f"{type(failure).__name__}: {failure}" in str(error):
            return failure
    return None


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
