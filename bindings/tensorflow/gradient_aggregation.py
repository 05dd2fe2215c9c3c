"""Local gradient aggregation for TF1 optimizers: backward_passes_per_step > 1 in a graph.

Horovod's LocalGradientAggregationHelper, with the same observable behaviour: each run of the
`compute_gradients()` ops adds the pass's gradients to accumulator variables and counts the
pass; on every n-th pass the accumulated gradients are all-reduced (their sum, or their mean
with average_aggregated_gradients) and the count returns to 0. `apply_gradients()` applies
only on those passes; on the others it only advances `global_step`, so the global step still
counts passes. The accumulators and the count are local variables
(`tf.compat.v1.GraphKeys.LOCAL_VARIABLES`), as in Horovod: MonitoredTrainingSession
initializes them; a plain Session needs `tf.compat.v1.local_variables_initializer()` too, and
`broadcast_global_variables` leaves them alone.

Every rank runs the same passes, so every rank takes the same branch of each `tf.cond` and the
all-reduce inside it runs on all ranks or on none.
"""

import tensorflow as tf

__all__ = ["GradientAggregator"]

tf1 = tf.compat.v1


def _dense(grad):
    # An accumulator is dense: sparse gradients are added as dense ones (Horovod refuses them
    # unless sparse_as_dense=True).
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


class GradientAggregator:
    """Accumulate gradients over `passes` runs; all-reduce them with `reduce` on the last."""

    def __init__(self, passes: int, reduce, *, average: bool, name: str):
        self.passes, self.reduce, self.average, self.name = passes, reduce, average, name
        self.counter = None
        self.accumulators: dict = {}  # index of the gradient -> its accumulator

    def _local_variable(self, initial, name: str):
        return tf1.Variable(
            initial,
            trainable=False,
            collections=[tf1.GraphKeys.LOCAL_VARIABLES],
            name=f"{self.name}_aggregation/{name}",
        )

    def _create(self, grads, variables) -> None:
        # In the outermost graph, whatever control flow compute_gradients() is called in.
        with tf.init_scope():
            self.counter = self._local_variable(tf.zeros([], tf.int32), "counter")
            for i, (grad, variable) in enumerate(zip(grads, variables)):
                if grad is not None:
                    zeros = tf.zeros(variable.shape, grad.dtype)
                    self.accumulators[i] = self._local_variable(zeros, str(i))

    def compute_gradients(self, grads, variables, local=None) -> list:
        """Return the ops' gradients: the all-reduced aggregate on every n-th pass, else local.

        Raises:
            ValueError: called eagerly (use a Keras optimizer or DistributedGradientTape), or
                again with other variables.
        """
        if tf.executing_eagerly():
            raise ValueError(
                "backward_passes_per_step > 1 with a tf.compat.v1.train optimizer needs a TF1 "
                "graph; eagerly, wrap a Keras optimizer (hvd.DistributedOptimizer accumulates "
                "with it) or accumulate the gradients of hvd.DistributedGradientTape yourself"
            )
        grads = list(grads)
        if self.counter is None:
            self._create(grads, variables)
        elif sorted(self.accumulators) != [i for i, g in enumerate(grads) if g is not None]:
            raise ValueError(
                "compute_gradients() was called again with other variables; with "
                "backward_passes_per_step > 1 build one DistributedOptimizer per set of variables"
            )
        present = sorted(self.accumulators)
        accumulators = [self.accumulators[i] for i in present]
        clear = tf.cond(
            tf.equal(self.counter, 0),
            lambda: tf.group(*[a.assign(tf.zeros_like(a)) for a in accumulators]),
            tf.no_op,
        )
        with tf.control_dependencies([clear]):
            added = [a.assign_add(_dense(grads[i])) for i, a in zip(present, accumulators)]
        with tf.control_dependencies(added):
            count = self.counter.assign_add(1)

        def reduce_aggregate():
            total = [None] * len(grads)
            for i, accumulator in zip(present, accumulators):
                total[i] = accumulator.read_value()
            everyone = self.reduce(total, local=local)
            reduced = [everyone[i] for i in present]
            if self.average:
                reduced = [g / tf.cast(self.passes, g.dtype) for g in reduced]
            with tf.control_dependencies(reduced):
                reset = self.counter.assign(0)
            with tf.control_dependencies([reset]):
                return [tf.identity(g) for g in reduced]

        def this_pass():
            return [tf.identity(_dense(grads[i])) for i in present]

        chosen = tf.cond(tf.equal(count, self.passes), reduce_aggregate, this_pass)
        out = [None] * len(grads)
        for i, grad in zip(present, tf.nest.flatten(chosen)):
            out[i] = grad
        return out

    def apply_gradients(self, apply, grads, global_step=None):
        """Return the op that runs `apply()` on passes that all-reduced, else steps global_step.

        `grads` are the gradients compute_gradients() returned: they decide when the count is
        read, after this pass has updated it.
        """
        with tf.control_dependencies([g for g in grads if g is not None]):
            applying = tf.equal(self.counter.read_value(), 0)

        # Both branches return a tensor: tf.cond in a TF2-behaviour graph needs equal outputs.
        def update():
            with tf.control_dependencies([apply()]):
                return tf.constant(True)

        def skip():
            if global_step is None:
                return tf.constant(False)
            with tf.control_dependencies([global_step.assign_add(1)]):
                return tf.constant(False)

        return tf.group(tf.cond(applying, update, skip))
