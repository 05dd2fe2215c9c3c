"""horovodlite.keras: Horovod's Keras API for Keras 3, on the tensorflow and torch backends.

Change `import horovod.tensorflow.keras as hvd` to `import horovodlite.keras as hvd` and run.
"""

from horovodlite import allgather_object, broadcast_object
from horovodlite.training import common
from horovodlite.training.common import *  # noqa: F403

from . import callbacks, elastic, functions
from .compression import Compression
from .functions import *  # noqa: F403
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer, load_model

# Its own names, the core's that every binding shares, and all of functions'.
__all__ = [
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "load_model",
    "callbacks",
    "elastic",
    "broadcast_object",
    "allgather_object",
]
__all__ += common.__all__
__all__ += functions.__all__
