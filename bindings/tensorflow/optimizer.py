"""DistributedOptimizer: a TF1 optimizer that all-reduces its gradients, or a Keras one.

The top of the bindings' layers: a Keras optimizer is handed to horovodlite.keras, which itself
builds on this package's ops and gradients modules, never on this one.
"""

import tensorflow as tf
from horovodlite.ops import ReduceOp
from horovodlite.process_sets import global_process_set
from horovodlite.training import LocalVariables, ReductionSettings
from horovodlite.training.updates import combine_updates, combines_updates

from .compression import Compression
from .gradient_aggregation import GradientAggregator
from .gradients import GradientReducer

__all__ = ["DistributedOptimizer"]


class _DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """A tf.compat.v1.train.Optimizer whose compute_gradients() all-reduces the gradients.

    With backward_passes_per_step > 1 a GradientAggregator accumulates them in the graph and
    all-reduces every n-th pass, and apply_gradients() applies on those passes only.
    """

    def __init__(
        self,
        optimizer,
        *,
        name,
        use_locking: bool,
        reducer: GradientReducer,
        average_aggregated_gradients: bool,
    ):
        self._optimizer, self._reducer = optimizer, reducer
        name = name or f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._local = LocalVariables()
        passes = reducer.settings.backward_passes_per_step
        self._aggregator = None
        if passes > 1:
            self._aggregator = GradientAggregator(
                passes, reducer, average=average_aggregated_gradients, name=name
            )

    def register_local_var(self, var):
        """Keep the gradient of `var` on this rank: it is not all-reduced (Horovod 0.28)."""
        self._local.add(var)

    def compute_gradients(self, *args, **kwargs):
        """Compute the gradients with the wrapped optimizer, then all-reduce them."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        local = self._local.mask(variables) if len(self._local) else None
        if self._aggregator is not None:
            reduced = self._aggregator.compute_gradients(grads, variables, local=local)
        else:
            reduced = self._reducer(list(grads), local=local)
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Apply the (all-reduced) gradients with the wrapped optimizer."""
        if self._aggregator is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        grads_and_vars = list(grads_and_vars)
        return self._aggregator.apply_gradients(
            lambda: self._optimizer.apply_gradients(grads_and_vars, global_step, name),
            [grad for grad, _ in grads_and_vars],
            global_step,
        )

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


class _AdasumOptimizerV1(_DistributedOptimizerV1):
    """Horovod's Adasum optimizer for TF1: step on the local gradients, combine the updates."""

    def compute_gradients(self, *args, **kwargs):
        """Compute this rank's gradients: with Adasum they stay local (see apply_gradients)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Apply the local gradients, then add to each variable's start the Adasum of updates."""
        grads_and_vars = list(grads_and_vars)
        variables = [v for g, v in grads_and_vars if g is not None and v not in self._local]
        starts, applied, assigned = [], [], []

        def copy(variable):
            starts.append(tf.identity(variable.read_value()))
            return starts[-1]

        def step():
            # In a graph the control dependencies order the reads, the step and the updates.
            with tf.control_dependencies(starts):
                applied.append(self._optimizer.apply_gradients(grads_and_vars, global_step, name))

        def delta(variable, start):
            with tf.control_dependencies([op for op in applied if op is not None]):
                return variable.read_value() - start

        def assign(variable, start, update):
            assigned.append(variable.assign(start + update))

        combine_updates(
            variables, step, copy=copy, delta=delta, reduce=self._reducer, assign=assign
        )
        return tf.group(*assigned, *[op for op in applied if op is not None])


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
    all-reduced gradients; with backward_passes_per_step = n > 1 (in a TF1 graph) they are
    accumulated locally and all-reduced on every n-th run, when apply_gradients() applies them
    (their sum, or their mean with average_aggregated_gradients). `register_local_var(var)`
    keeps a variable's gradient on its rank.

    With op=Adasum a TF1 optimizer is Horovod's Adasum optimizer: compute_gradients() returns the
    local gradients, and apply_gradients() steps on them and then sets each variable to its
    start plus the Adasum of the ranks' updates. A Keras optimizer reduces its gradients with
    Adasum instead, as horovodlite.keras does (docs/adasum.md).

    Raises:
        ValueError, NotImplementedError: a bad argument (see ReductionSettings).
        TypeError: `optimizer` is neither kind.
    """
    v1 = isinstance(optimizer, tf.compat.v1.train.Optimizer)
    settings = ReductionSettings.from_arguments(locals())
    if v1:
        adasum = combines_updates(settings)
        if adasum and backward_passes_per_step != 1:
            raise ValueError(
                "op=Adasum with a tf.compat.v1 optimizer steps on each run's local gradients: "
                "use backward_passes_per_step=1, or a Keras optimizer"
            )
        return (_AdasumOptimizerV1 if adasum else _DistributedOptimizerV1)(
            optimizer,
            name=name,
            use_locking=use_locking,
            reducer=GradientReducer(settings),
            average_aggregated_gradients=average_aggregated_gradients,
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
