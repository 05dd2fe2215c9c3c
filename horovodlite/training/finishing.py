"""A collective that a binding waits for later: run at once, or handed to the engine.

A binding that builds a collective in one place and takes its result in another (TensorFlow's
ops, the collectives' gradients) holds a `Finish`: `finish()` returns the result. Where nothing
comes between the two (TensorFlow's eager ops, torch's and JAX's backward passes) the
collective runs at once as a blocking call, in program order, without the engine's round trip
(two thread hand-offs, docs/benchmarks.md); in TensorFlow's graphs it goes to the engine, which
matches requests by name (bindings/tensorflow/op_runner.py says why).
"""

from typing import Callable

from ..asynchronous import synchronize

__all__ = ["Finish", "started"]

Finish = Callable[[], list]


def started(blocking: bool, now: Callable, start: Callable, *args, **kwargs) -> Finish:
    """Run the blocking collective `now(*args, **kwargs)` at once if `blocking`, else submit its
    asynchronous form `start`; return the finish that gives its result."""
    if blocking:
        result = now(*args, **kwargs)
        return lambda: result
    handle = start(*args, **kwargs)
    return lambda: synchronize(handle)
