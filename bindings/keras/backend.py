"""The Keras backend's horovodlite binding: collectives on the backend's own tensors.

With the tensorflow backend tensors go through horovodlite.tensorflow (ops that also work in the
graph `model.fit` compiles); with the torch backend through horovodlite.torch. Variables are
broadcast through numpy, which every backend can read and assign.
"""

import numpy as np

import horovodlite as core
import keras
from horovodlite.ops import ReduceOp, resolve_op
from horovodlite.process_sets import global_process_set

__all__ = ["framework", "GradientReducer", "broadcast_variables"]

SUPPORTED = ("tensorflow", "torch")


def framework():
    """Return horovodlite.tensorflow or horovodlite.torch, after the Keras backend."""
    name = keras.backend.backend()
    if name == "tensorflow":
        import horovodlite.tensorflow as binding
    elif name == "torch":
        import horovodlite.torch as binding
    else:
        raise NotImplementedError(
            f"horovodlite.keras supports the {' and '.join(SUPPORTED)} Keras backends, not "
            f"{name!r}: set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch"
        )
    return binding


class GradientReducer:
    """All-reduce a list of gradients (None stays None) in one fused request per dtype."""

    def __init__(
        self,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        process_set,
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
        if not hasattr(compression, "compress") or not hasattr(compression, "decompress"):
            raise TypeError(
                "compression must be a Compression strategy such as hvd.Compression.fp16, "
                f"got {compression!r}"
            )
        self.backend = keras.backend.backend()
        self.binding = framework()
        self.compression, self.sparse_as_dense = compression, sparse_as_dense
        self.process_set = process_set
        self.prescale = 1.0 / gradient_predivide_factor
        self.postscale = gradient_predivide_factor * postscale_factor
        if self.backend == "tensorflow":
            from horovodlite.tensorflow.optimizer import GradientReducer as TFReducer

            self._tf = TFReducer(
                compression,
                sparse_as_dense,
                self.op,
                gradient_predivide_factor,
                process_set=process_set,
                postscale_factor=postscale_factor,
            )

    def __call__(self, grads: list) -> list:
        if self.backend == "tensorflow":
            return self._tf(grads)
        return self._torch(grads)

    def _torch(self, grads: list) -> list:
        grads = list(grads)
        if self.process_set.size() == 1 and self.process_set.included():  # as in hvd.tensorflow
            scale = self.prescale * self.postscale
            return [g if g is None or scale == 1.0 else g * scale for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        compressed = {i: self.compression.compress(grads[i]) for i in present}
        groups: dict = {}
        for i in present:
            groups.setdefault(compressed[i][0].dtype, []).append(i)
        handles = [
            self.binding.grouped_allreduce_async(
                [compressed[i][0].contiguous() for i in members],
                op=self.op,
                prescale_factor=self.prescale,
                postscale_factor=self.postscale,
                process_set=self.process_set,
            )
            for members in groups.values()
        ]
        out = list(grads)
        for members, handle in zip(groups.values(), handles):
            for i, reduced in zip(members, self.binding.synchronize(handle)):
                out[i] = self.compression.decompress(reduced, compressed[i][1])
        return out


def broadcast_variables(variables, root_rank, process_set=global_process_set) -> None:
    """Overwrite each Keras variable in `variables` with `root_rank`'s value (eagerly)."""
    variables = list(variables)
    arrays = [np.array(keras.ops.convert_to_numpy(v.value), order="C") for v in variables]
    handles = [core.broadcast_async_(a, root_rank, process_set=process_set) for a in arrays]
    for variable, handle in zip(variables, handles):
        variable.assign(core.synchronize(handle))
