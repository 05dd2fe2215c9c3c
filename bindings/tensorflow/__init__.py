"""horovodlite.tensorflow: Horovod's TensorFlow API on horovodlite. Change the import and run.

Works eagerly, inside `tf.function` (including the graph `model.fit` compiles) and in TF1-style
graphs run by `tf.compat.v1.Session`.
"""

from horovodlite.training import common
from horovodlite.training.common import *  # noqa: F403

from . import functions, mpi_ops
from .compression import Compression
from .functions import *  # noqa: F403
from .gradients import DistributedGradientTape, PartialDistributedGradientTape
from .mpi_ops import *  # noqa: F403
from .optimizer import DistributedOptimizer

# Its own names, the core's that every binding shares, and all of mpi_ops' and functions'.
__all__ = [
    "Compression",
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "DistributedOptimizer",
    "SyncBatchNormalization",  # noqa: F405 (module __getattr__, below)
]
__all__ += common.__all__
__all__ += mpi_ops.__all__
__all__ += functions.__all__


def __getattr__(name):
    # SyncBatchNormalization is a Keras layer: Keras loads (seconds) only when it is asked for,
    # since TF1 scripts need no Keras.
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    if name == "elastic":
        # hvd.elastic (TensorFlowKerasState needs Keras): loaded on first use, as above.
        import importlib

        return importlib.import_module(".elastic", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
