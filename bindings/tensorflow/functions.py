"""Broadcasting variables and Python objects; the TF1 session hook that starts training in step."""

import horovodlite as core
import tensorflow as tf
from horovodlite.process_sets import global_process_set

from .mpi_ops import broadcast_

__all__ = [
    "broadcast_variables",
    "broadcast_global_variables",
    "BroadcastGlobalVariablesHook",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
]


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Overwrite each of `variables` with `root_rank`'s value, in one op.

    Eagerly the variables are updated at once and None is returned; in a graph this returns the
    op to run. `inplace` is accepted for Horovod; the variables are always assigned in place.
    """
    assigns = broadcast_(list(variables), root_rank, process_set=process_set)
    if tf.executing_eagerly():
        return None
    return tf.group(*assigns)


def broadcast_global_variables(root_rank):
    """Return the op that broadcasts every global variable from `root_rank` (TF1 graphs).

    Raises:
        RuntimeError: eager execution has no global variables: use broadcast_variables().
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "broadcast_global_variables() needs a TF1 graph (eager TensorFlow has no global "
            "variables): use hvd.broadcast_variables(model.variables + optimizer.variables, "
            "root_rank) instead"
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcast every global variable from `root_rank` once the session is created.

    For `tf.compat.v1.train.MonitoredTrainingSession`: all ranks then start from the same
    weights, whether the root initialized them at random or restored a checkpoint.
    """

    def __init__(self, root_rank, device="", process_set=global_process_set):
        super().__init__()
        self.root_rank, self.process_set = root_rank, process_set
        self.bcast_op = None

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            with tf.device("/cpu:0"):
                self.bcast_op = broadcast_variables(
                    tf.compat.v1.global_variables(), self.root_rank, process_set=self.process_set
                )

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Return `root_rank`'s picklable `obj` on every rank. `session` is accepted for Horovod."""
    return core.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Return a function that broadcasts its picklable argument from `root_rank`.

    Horovod builds placeholders and runs them in `session` (TF1); here the returned function
    calls broadcast_object, so it needs no session and works eagerly and in graphs alike.
    """

    def broadcast_one(obj):
        return core.broadcast_object(obj, root_rank, name=name, process_set=process_set)

    return broadcast_one


def allgather_object(obj, session=None, name=None, process_set=global_process_set) -> list:
    """Return every rank's picklable `obj`, in rank order. `session` is accepted for Horovod."""
    return core.allgather_object(obj, name=name, process_set=process_set)
