"""Collectives on the Keras backend's tensors, and broadcasting variables."""

import numpy as np

import horovodlite as core
import keras
from horovodlite.ops import ReduceOp
from horovodlite.process_sets import global_process_set

from .backend import framework
from .compression import Compression

__all__ = [
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "broadcast_variables",
    "broadcast_global_variables",
]


def allreduce(
    value,
    name=None,
    average=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    op=None,
    compression=Compression.none,
    process_set=global_process_set,
):
    """Return the reduction of `value` (a tensor or array) over the ranks, as a backend tensor."""
    return framework().allreduce(
        keras.ops.convert_to_tensor(value),
        average=average,
        name=name,
        op=op,
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )


def allgather(value, name=None, process_set=global_process_set):
    """Return every rank's `value` concatenated on dimension 0, as a backend tensor."""
    tensor = keras.ops.convert_to_tensor(value)
    return framework().allgather(tensor, name=name, process_set=process_set)


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    """Return `root_rank`'s `value` on every rank, as a backend tensor."""
    tensor = keras.ops.convert_to_tensor(value)
    return framework().broadcast(tensor, root_rank, name=name, process_set=process_set)


def reducescatter(value, name=None, op=ReduceOp.AVERAGE, process_set=global_process_set):
    """Reduce `value` over the ranks and return this rank's rows of dimension 0."""
    tensor = keras.ops.convert_to_tensor(value)
    return framework().reducescatter(tensor, name=name, op=op, process_set=process_set)


def broadcast_variables(variables, root_rank, process_set=global_process_set) -> None:
    """Overwrite Keras variables (`model.variables`, `optimizer.variables`) with the root's.

    Eagerly, through numpy, which every backend can read and assign.
    """
    variables = list(variables)
    arrays = [np.array(keras.ops.convert_to_numpy(v.value), order="C") for v in variables]
    handles = [core.broadcast_async_(array, root_rank, process_set=process_set) for array in arrays]
    for variable, handle in zip(variables, handles):
        variable.assign(core.synchronize(handle))


def broadcast_global_variables(root_rank):
    """Keras 3 has no global variables: raise, naming what to use instead.

    Raises:
        RuntimeError: always; Keras 3 keeps variables per model and optimizer.
    """
    raise RuntimeError(
        "Keras 3 has no global variables to broadcast: add "
        "hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) to model.fit's callbacks, or "
        "call hvd.broadcast_variables(model.variables + optimizer.variables, root_rank)"
    )
