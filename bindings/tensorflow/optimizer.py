"""DistributedGradientTape and DistributedOptimizer: all-reduce gradients before they are used.

All dense gradients of one step go to the engine in one op, as one fused buffer per dtype.
`tf.IndexedSlices` (embedding gradients) are all-gathered, as Horovod does, unless
`sparse_as_dense=True` makes them dense first.
"""

import tensorflow as tf
from horovodlite.ops import ReduceOp, resolve_op
from horovodlite.process_sets import global_process_set

from .compression import Compression
from .mpi_ops import grouped_allreduce

__all__ = ["DistributedGradientTape", "DistributedOptimizer", "GradientReducer"]


class GradientReducer:
    """The all-reduce of a list of gradients, as the distributed tape and optimizers use it.

    Validates its settings at construction, before any communication.
    """

    def __init__(
        self,
        compression=Compression.none,
        sparse_as_dense=False,
        op=ReduceOp.AVERAGE,
        gradient_predivide_factor=1.0,
        num_groups=0,
        groups=None,
        process_set=global_process_set,
        postscale_factor=1.0,
    ):
        self.op = resolve_op(op, None)
        if self.op == ReduceOp.ADASUM:
            raise NotImplementedError("Adasum is not implemented in horovodlite: use Average")
        if self.op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
            raise ValueError(f"gradients are reduced with Average or Sum, got op={self.op.name}")
        if gradient_predivide_factor != 1.0 and self.op != ReduceOp.AVERAGE:
            raise ValueError(
                "gradient_predivide_factor only applies to op=Average: divide by it before the "
                "sum and multiply after, so the result is still the average"
            )
        if num_groups and groups is not None:
            raise ValueError("give num_groups or groups, not both")
        if not isinstance(num_groups, int) or num_groups < 0:
            raise ValueError(f"num_groups must be a non-negative int, got {num_groups!r}")
        if not hasattr(compression, "compress") or not hasattr(compression, "decompress"):
            raise TypeError(
                f"compression must be a Compression strategy such as hvd.Compression.fp16, "
                f"got {compression!r}"
            )
        self.compression, self.sparse_as_dense = compression, sparse_as_dense
        self.process_set = process_set
        # Average with a predivide factor f: divide by f before the sum, multiply by f after.
        self.prescale = 1.0 / gradient_predivide_factor
        self.postscale = gradient_predivide_factor * postscale_factor

    def __call__(self, grads: list) -> list:
        """Return `grads` all-reduced (None entries stay None), in one op for the dense ones."""
        grads = list(grads)
        present = [i for i, g in enumerate(grads) if g is not None]
        tensors = []
        for i in present:
            grad = grads[i]
            if self.sparse_as_dense and isinstance(grad, tf.IndexedSlices):
                grad = tf.convert_to_tensor(grad)
            tensors.append(grad)
        if self.process_set.size() == 1 and self.process_set.included():
            # Alone in the set, the reduction is the identity for Sum and Average: no op, no
            # engine request, as the torch DistributedOptimizer adds no hook. Only the scale
            # that backward_passes_per_step folds into postscale_factor is left to apply.
            reduced = [_scaled(t, self.prescale * self.postscale) for t in tensors]
        else:
            reduced = grouped_allreduce(
                tensors,
                compression=self.compression,
                op=self.op,
                prescale_factor=self.prescale,
                postscale_factor=self.postscale,
                process_set=self.process_set,
            )
        out = list(grads)
        for i, grad in zip(present, reduced):
            out[i] = grad
        return out


def _scaled(grad, factor: float):
    if factor == 1.0:
        return grad
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
    it can wrap a tape after (or before) the `with` block.
    """
    reducer = GradientReducer(
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
    )
    base = type(gradtape)

    class _DistributedGradientTape(base):
        def gradient(self, target, sources, output_gradients=None, **kwargs):
            grads = super().gradient(target, sources, output_gradients, **kwargs)
            flat = tf.nest.flatten(grads, expand_composites=False)
            return tf.nest.pack_sequence_as(grads, self._horovodlite_reduce(flat))

    _DistributedGradientTape.__name__ = base.__name__
    _DistributedGradientTape.__qualname__ = base.__qualname__
    tape = object.__new__(_DistributedGradientTape)
    tape.__dict__.update(gradtape.__dict__)
    tape._horovodlite_reduce = reducer
    return tape


class _DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer whose compute_gradients() all-reduces the gradients."""

    def __init__(self, optimizer, name, use_locking, reducer):
        self._optimizer, self._reducer = optimizer, reducer
        super().__init__(
            name=name or f"Distributed{type(optimizer).__name__}", use_locking=use_locking
        )

    def compute_gradients(self, *args, **kwargs):
        """Compute the gradients with the wrapped optimizer, then all-reduce them."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        return list(zip(self._reducer(list(grads)), variables))

    def apply_gradients(self, *args, **kwargs):
        """Apply the (all-reduced) gradients with the wrapped optimizer."""
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(
    optimizer,
    name=None,
    use_locking=False,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=ReduceOp.AVERAGE,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Wrap a `tf.compat.v1.train.Optimizer` or a Keras optimizer to all-reduce gradients.

    A Keras optimizer is handed to horovodlite.keras.DistributedOptimizer (same arguments). For
    a TF1 optimizer, `minimize()` and `compute_gradients()` return all-reduced gradients.

    Raises:
        ValueError: backward_passes_per_step > 1 with a TF1 optimizer (accumulate the gradients
            yourself, or use a Keras optimizer, which supports it).
        TypeError: `optimizer` is neither kind.
    """
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise ValueError(
                "backward_passes_per_step > 1 is supported for Keras optimizers only; with a "
                "tf.compat.v1.train optimizer, accumulate the gradients before apply_gradients"
            )
        reducer = GradientReducer(
            compression,
            sparse_as_dense,
            op,
            gradient_predivide_factor,
            num_groups,
            groups,
            process_set,
        )
        return _DistributedOptimizerV1(optimizer, name, use_locking, reducer)
    try:
        import keras
    except ImportError:
        keras = None
    if keras is not None and isinstance(optimizer, keras.optimizers.Optimizer):
        from horovodlite.keras import DistributedOptimizer as KerasDistributedOptimizer

        return KerasDistributedOptimizer(
            optimizer,
            name=name,
            compression=compression,
            sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor,
            op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients,
            num_groups=num_groups,
            groups=groups,
            process_set=process_set,
        )
    raise TypeError(
        "DistributedOptimizer wraps a tf.compat.v1.train.Optimizer or a Keras optimizer, got "
        f"{type(optimizer).__name__}"
    )
