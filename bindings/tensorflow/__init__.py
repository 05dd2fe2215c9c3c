"""horovodlite.tensorflow: Horovod's TensorFlow API on horovodlite. Change the import and run.

Works eagerly, inside `tf.function` (including the graph `model.fit` compiles) and in TF1-style
graphs run by `tf.compat.v1.Session`.
"""

from horovodlite.training import common
from horovodlite.training.common import *  # noqa: F403

from . import functions, mpi_ops
from .compression import Compression
from .functions import *  # noqa: F403
from .gradients import DistributedGradientTape
from .mpi_ops import *  # noqa: F403
from .optimizer import DistributedOptimizer

# Its own names, the core's that every binding shares, and all of mpi_ops' and functions'.
__all__ = ["Compression", "DistributedGradientTape", "DistributedOptimizer"]
__all__ += common.__all__
__all__ += mpi_ops.__all__
__all__ += functions.__all__
