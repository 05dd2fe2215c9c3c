"""The Keras backend's binding: which framework's collectives and gradient reducer to use.

With the tensorflow backend tensors go through horovodlite.tensorflow's ops (which also work in
the graph `model.fit` compiles); with the torch backend through horovodlite.torch's. Only the
modules named below are imported, never those packages' optimizers: horovodlite.tensorflow's
DistributedOptimizer builds on this package.
"""

import operator

import keras
from horovodlite.training import ReductionSettings, reduce_gradients

__all__ = ["framework", "gradient_reducer"]

SUPPORTED = ("tensorflow", "torch")


def framework():
    """Return the collectives module for the Keras backend (a binding's mpi_ops).

    Raises:
        NotImplementedError: the backend is neither tensorflow nor torch.
    """
    name = keras.backend.backend()
    # Imported here: only the framework of the backend Keras runs on need be installed.
    if name == "tensorflow":
        from horovodlite.tensorflow import mpi_ops
    elif name == "torch":
        from horovodlite.torch import mpi_ops
    else:
        raise NotImplementedError(
            f"horovodlite.keras supports the {' and '.join(SUPPORTED)} Keras backends, not "
            f"{name!r}: set KERAS_BACKEND=tensorflow or KERAS_BACKEND=torch"
        )
    return mpi_ops


def gradient_reducer(settings: ReductionSettings):
    """Return the callable that all-reduces a list of the backend's gradients as `settings` say.

    Raises:
        NotImplementedError: the backend is neither tensorflow nor torch.
    """
    if keras.backend.backend() == "tensorflow":
        # Imported here for the same reason as in framework().
        from horovodlite.tensorflow.gradients import GradientReducer

        return GradientReducer(settings)
    return _TorchGradientReducer(settings, framework())


class _TorchGradientReducer:
    """All-reduce lists of torch gradients: one fused request per dtype, None stays None."""

    def __init__(self, settings: ReductionSettings, ops):
        self.settings, self.ops = settings, ops  # ops: horovodlite.torch.mpi_ops

    def __call__(self, grads, local=None) -> list:
        return reduce_gradients(
            grads, self.settings, reduce=self._reduce, scale=operator.mul, local=local
        )

    def _reduce(self, tensors: list) -> list:
        compression = self.settings.compression
        compressed = [compression.compress(t) for t in tensors]
        wires = [t.contiguous() for t, _ in compressed]
        # One blocking call, one fused buffer per dtype: nothing runs between submit and wait.
        reduced = self.ops.grouped_allreduce(wires, **self.settings.reduce_kwargs)
        return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]
