"""DistributedOptimizer: a TF1 optimizer that all-reduces its gradients, or a Keras one.

The top of the bindings' layers: a Keras optimizer is handed to horovodlite.keras, which itself
builds on this package's ops and gradients modules, never on this one.
"""

import tensorflow as tf
from horovodlite.ops import ReduceOp
from horovodlite.process_sets import global_process_set
from horovodlite.training import ReductionSettings

from .compression import Compression
from .gradients import GradientReducer

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer whose compute_gradients() all-reduces the gradients."""

    def __init__(self, optimizer, *, name, use_locking: bool, reducer: GradientReducer):
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

    A Keras optimizer is wrapped by horovodlite.keras, as its DistributedOptimizer would with
    the same arguments. For a TF1 optimizer, `minimize()` and `compute_gradients()` return
    all-reduced gradients.

    Raises:
        ValueError: backward_passes_per_step > 1 with a TF1 optimizer (accumulate the gradients
            yourself, or use a Keras optimizer, which supports it), or another bad argument (see
            ReductionSettings).
        TypeError: `optimizer` is neither kind.
    """
    v1 = isinstance(optimizer, tf.compat.v1.train.Optimizer)
    if v1 and backward_passes_per_step != 1:
        raise ValueError(
            "backward_passes_per_step > 1 is supported for Keras optimizers only; with a "
            "tf.compat.v1.train optimizer, accumulate the gradients before apply_gradients"
        )
    settings = ReductionSettings(
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        num_groups=num_groups,
        groups=groups,
        process_set=process_set,
    )
    if v1:
        reducer = GradientReducer(settings)
        return _DistributedOptimizerV1(
            optimizer, name=name, use_locking=use_locking, reducer=reducer
        )
    # Imported here: Keras is optional for TF1 users and slow to import, and horovodlite.keras
    # imports this package's ops and gradients modules, so it loads only once this package has.
    try:
        import keras
    except ImportError:
        keras = None
    if keras is not None and isinstance(optimizer, keras.optimizers.Optimizer):
        from horovodlite.keras.optimizer import wrap

        return wrap(
            optimizer,
            settings,
            name=name,
            average_aggregated_gradients=average_aggregated_gradients,
        )
    raise TypeError(
        "DistributedOptimizer wraps a tf.compat.v1.train.Optimizer or a Keras optimizer, got "
        f"{type(optimizer).__name__}"
    )
