"""GradientReducer and DistributedGradientTape: all-reduce a list of gradients before use.

All dense gradients of one step go to the engine in one op, as one fused buffer per dtype.
`tf.IndexedSlices` (embedding gradients) are all-gathered, as Horovod does, unless
`sparse_as_dense=True` makes them dense first. Gradients of registered worker-local sources
(`register_local_source`, PartialDistributedGradientTape's `local_layers`) stay on their rank.
horovodlite.keras uses GradientReducer on the tensorflow backend, so this module must not import
horovodlite.keras.
"""

import tensorflow as tf
from horovodlite.ops import ReduceOp
from horovodlite.process_sets import global_process_set
from horovodlite.training import (
    LocalVariables,
    ReductionSettings,
    layer_variables,
    reduce_gradients,
)

from .compression import Compression
from .mpi_ops import grouped_allreduce

__all__ = ["GradientReducer", "DistributedGradientTape", "PartialDistributedGradientTape"]


class GradientReducer:
    """All-reduce lists of gradients as `settings` say: None stays None, dense ones in one op."""

    def __init__(self, settings: ReductionSettings):
        self.settings = settings

    def __call__(self, grads, local=None) -> list:
        """Return `grads` all-reduced, in order; those flagged in `local` stay on this rank."""
        if self.settings.sparse_as_dense:
            grads = [_dense(g) for g in grads]
        return reduce_gradients(
            grads, self.settings, reduce=self._reduce, scale=_scaled, local=local
        )

    def _reduce(self, tensors: list) -> list:
        return grouped_allreduce(
            tensors, compression=self.settings.compression, **self.settings.reduce_kwargs
        )


def _dense(grad):
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _scaled(grad, factor: float):
    if isinstance(grad, tf.IndexedSlices):
        values = grad.values * tf.cast(factor, grad.values.dtype)
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def DistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=ReduceOp.AVERAGE,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Return `gradtape` as a tape whose gradient() all-reduces the gradients it computes.

    The result is an instance of a subclass of the tape's own class sharing its recording, so
    it can wrap a tape after (or before) the `with` block. Its `register_local_source(var)`
    keeps `var`'s gradient on this rank (not all-reduced; divided by the process set's size if
    `scale_local_gradients`), and `get_local_and_global_gradients(target, sources)` returns the
    `(source, gradient)` pairs of the local sources and of the others.

    Raises:
        ValueError, TypeError, NotImplementedError: a bad argument (see ReductionSettings).
    """
    reducer = GradientReducer(ReductionSettings.from_arguments(locals()))
    base = type(gradtape)

    class _DistributedGradientTape(base):
        def register_local_source(self, source):
            """Keep the gradient of `source` (a variable) on this rank: it is not all-reduced."""
            self._horovodlite_local.add(source)

        def gradient(
            self, target, sources, output_gradients=None, use_generic_names=False, **kwargs
        ):
            grads = super().gradient(target, sources, output_gradients, **kwargs)
            flat = tf.nest.flatten(grads, expand_composites=False)
            local = None
            if len(self._horovodlite_local):
                local = self._horovodlite_local.mask(tf.nest.flatten(sources))
            return tf.nest.pack_sequence_as(grads, self._horovodlite_reduce(flat, local=local))

        def get_local_and_global_gradients(
            self, target, sources, output_gradients=None, use_generic_names=False
        ):
            """Return `([(source, grad)] of the local sources, [(source, grad)] of the rest)`."""
            sources = tf.nest.flatten(sources)
            grads = self.gradient(target, sources, output_gradients)
            pairs = list(zip(sources, grads))
            local = [pair for pair in pairs if pair[0] in self._horovodlite_local]
            return local, [pair for pair in pairs if pair[0] not in self._horovodlite_local]

    _DistributedGradientTape.__name__ = base.__name__
    _DistributedGradientTape.__qualname__ = base.__qualname__
    tape = object.__new__(_DistributedGradientTape)
    tape.__dict__.update(gradtape.__dict__)
    tape._horovodlite_reduce = reducer
    tape._horovodlite_local = LocalVariables()
    return tape


def PartialDistributedGradientTape(gradtape, *args, local_layers=None, **kwargs):
    """Return DistributedGradientTape(gradtape, ...) with the variables of `local_layers` local.

    Takes DistributedGradientTape's arguments, and `local_layers`: the trainable weights of
    these Keras layers (a layer or a list of layers) are registered with
    `register_local_source`, so their gradients are not all-reduced.

    Raises:
        TypeError: an entry of `local_layers` is not a Keras layer.
        ValueError, NotImplementedError: a bad argument (see ReductionSettings).
    """
    local_variables = layer_variables(local_layers)
    tape = DistributedGradientTape(gradtape, *args, **kwargs)
    for variable in local_variables:
        tape.register_local_source(variable)
    return tape
