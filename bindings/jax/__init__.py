"""horovodlite.jax: Horovod's API for JAX and optax, eagerly and inside jax.jit."""

from horovodlite.training import common
from horovodlite.training.common import *  # noqa: F403

from . import elastic, functions, mpi_ops
from .compression import Compression
from .functions import *  # noqa: F403
from .mpi_ops import *  # noqa: F403
from .optimizer import DistributedOptimizer, DistributedState

# Its own names, the core's that every binding shares, and all of mpi_ops' and functions'.
__all__ = ["Compression", "DistributedOptimizer", "DistributedState", "elastic"]
__all__ += common.__all__
__all__ += mpi_ops.__all__
__all__ += functions.__all__
