"""JAX arrays on the host: how a collective reaches the core, eagerly or inside a trace.

The core works on numpy arrays. Outside any JAX transformation a collective views its arrays as
numpy (`np.asarray` of a CPU jax.Array shares its buffer where JAX allows) and hands the results
back with `jax.device_put`. Under `jax.jit`, `jax.grad` or `lax` control flow the same host
function runs as an XLA custom call (xla_ffi.py) that reads and writes XLA's own buffers. A
collective's output shape must then be known when it is traced.

Every rank must meet its collectives in the same order. XLA runs the calls of one computation in
the order of its schedule, which depends on the shapes, and those may differ between ranks (an
allgather of uneven rows): so each traced collective waits on a token written by the one traced
before it (see "the order of a trace's collectives" below). JAX runs the computations of a
device one at a time, in the order they were dispatched; a computation returns before it has
run, so an eager collective first waits for those already dispatched (`settle`), or a jitted
step's collectives, running on XLA's thread, could meet this one's in another order on another
rank. On a GPU backend a collective is an ordered `io_callback` instead (XLA keeps those in
program order), its arrays through host memory. A collective cannot be batched: under `jax.vmap`
it raises a ValueError that says so, whatever the order of vmap and jit.

A collective's error inside a trace reaches the caller as JAX's JaxRuntimeError (or ValueError,
jax-ml/jax#34083), which keeps only its text; `collective_failure` finds the horovodlite error
behind one (hvd.elastic.run needs it).
"""

import contextlib
import functools
import threading
import weakref
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np

import jax
import jax.numpy as jnp
from horovodlite.exceptions import HorovodLiteError
from jax.custom_batching import custom_vmap
from jax.experimental import io_callback
from jax.extend.core import find_top_trace

from . import xla_ffi

__all__ = [
    "traced",
    "run_on_host",
    "host_arrays",
    "settle",
    "order_token",
    "follow",
    "linked",
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

# Under a trace, arrays smaller than this travel packed into one buffer per dtype (a copy inside
# XLA): one operand of the custom call and one entry of the core's batch instead of many.
PACK_BELOW = 64 * 1024  # bytes


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
    settle()
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
    return _traced_call(what, host, into, list(arrays), list(outputs()))


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


def _traced_call(what: str, host: Host, into: Optional[Into], arrays: list, outputs: list) -> list:
    def remembering(run: Callable, *args):
        try:
            return run(*args)
        except HorovodLiteError as exc:
            _remember(exc)
            raise

    def into_outputs(inputs: list, outs: list) -> None:
        if into is not None:
            remembering(into, outs, *inputs)
            return
        for out, result in zip(outs, remembering(host, *inputs)):
            result = np.asarray(result)
            if result.shape != out.shape:  # (copyto would broadcast)
                raise ValueError(f"{what}: a result has shape {result.shape}, not {out.shape}")
            np.copyto(out, result, casting="unsafe")

    def on_host(*values):  # an io_callback's form of the same
        results = remembering(host, *[np.asarray(v) for v in values])
        # XLA takes exactly the declared dtypes: a 0-d result may come back as a numpy scalar.
        return [np.asarray(r, dtype=o.dtype) for r, o in zip(results, outputs)]

    link = _link()
    tokens = link.tokens if link is not None else [order_token(arrays)]
    count = len(tokens)

    def run(inputs: list, outs: list) -> None:
        outs[0][...] = 0  # the token: a value for the next call of the trace to wait on
        into_outputs(inputs[count:], outs[1:])

    @custom_vmap
    def call(*values):
        if jax.default_backend() != "cpu":
            results = io_callback(on_host, outputs, *values[count:], ordered=True)
            return (jnp.zeros((), np.float32), *results)
        # An in-place host writes over its inputs: XLA lends it an input's buffer as the
        # output's where the input is not needed after (else it copies it in first).
        aliases = {count + k: 1 + k for k in range(len(outputs))} if into is not None else None
        # XLA drops a call without side effects whose outputs are empty arrays (it knows their
        # value), which would skip this rank's part of the collective: such a call, and one
        # with no outputs, is marked as having one. Only those pay JAX's dispatch of an effect.
        empty = not outputs or any(o.size == 0 for o in outputs)
        call = jax.ffi.ffi_call(
            xla_ffi.TARGET,
            [_TOKEN, *outputs],
            has_side_effect=empty or any(v.size == 0 for v in values),
            input_output_aliases=aliases,
        )
        return call(*values, key=np.int64(xla_ffi.register(run)))

    @call.def_vmap
    def _batched(axis_size, in_batched, *values):
        raise ValueError(
            f"horovodlite.jax: {what} cannot run under jax.vmap: a collective is one call on "
            "every rank and cannot be batched; call it on the whole batched array outside vmap"
        )

    token, *results = call(*tokens, *arrays)
    if link is not None:
        link.tokens, link.called = [token], True
    else:
        follow(arrays, token)
    return results


# -- the order of a trace's collectives ------------------------------------------------------
#
# Every traced collective takes a token, a float32 scalar that the one before it in the same
# trace wrote, and writes one for the next: XLA runs a call only after its inputs exist, so
# the calls run in the order they were traced, whatever XLA's schedule (which depends on the
# shapes, and these may differ between ranks). A differentiable collective is a custom_vjp,
# traced apart from its caller: it takes the caller's token as an input and returns the next
# one as an output (`linked`). Its backward pass waits on its forward's token and on the
# cotangent of its output token, the token of the backward of the collective after it, and
# returns its own as the cotangent of its input token: the backward passes run in reverse
# order.

_TOKEN = jax.ShapeDtypeStruct((), np.float32)
_last_tokens: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # trace -> token
_links = threading.local()


def order_token(values):
    """Return the token of the last collective traced in the trace of `values`, or a zero:
    the next collective traced with `values` follows it."""
    token = _last_tokens.get(find_top_trace(tuple(values)))
    return token if token is not None else jnp.zeros((), np.float32)


class Link:
    """The tokens a custom_vjp rule's collectives wait on, and whether one ran (`called`)."""

    def __init__(self, tokens: list):
        self.tokens, self.called = tokens, False


def _link() -> Optional[Link]:
    stack = getattr(_links, "stack", None)
    return stack[-1] if stack else None


def follow(values, token) -> None:
    """Record `token` (a custom_vjp's output) as the last of the trace of `values`."""
    _last_tokens[find_top_trace(tuple(values))] = token


@contextlib.contextmanager
def linked(*tokens):
    """Inside a custom_vjp rule: its collectives wait on `tokens`, then on each other."""
    link = Link(list(tokens))
    _links.stack = [*getattr(_links, "stack", []), link]
    try:
        yield link
    finally:
        _links.stack = _links.stack[:-1]


def settle() -> None:
    """Wait until every computation JAX has dispatched on this rank has run (its collectives
    with it): JAX runs a device's computations one at a time, in the order they were
    dispatched, so a no-op dispatched now runs after them all."""
    jax.effects_barrier()  # the ordered callbacks of a GPU backend
    if jax.default_backend() == "cpu" and xla_ffi.used():
        _fence()().block_until_ready()


@functools.cache
def _fence() -> Callable:
    key = xla_ffi.register(lambda inputs, outputs: None)
    fence = jax.ffi.ffi_call(xla_ffi.TARGET, jax.ShapeDtypeStruct((), np.int32))
    return jax.jit(lambda: fence(key=np.int64(key)))


def _remember(failure: HorovodLiteError) -> None:
    global _last_failure
    _last_failure = failure


def collective_failure(error: BaseException) -> Optional[HorovodLiteError]:
    """Return the horovodlite error behind `error`, or None if there is none.

    Eagerly that is `error` itself. Inside jax.jit JAX raises a JaxRuntimeError that ends with the
    text of the collective's error, or a ValueError with that text where the jitted function
    ran before without an error (JAX's C++ dispatch types every failure so: jax-ml/jax#34083):
    the last error a traced collective raised, if the texts match.
    """
    if isinstance(error, HorovodLiteError):
        return error
    failure = _last_failure
    if isinstance(error, (jax.errors.JaxRuntimeError, ValueError)) and failure is not None:
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
