"""horovodlite.torch: Horovod's PyTorch API on horovodlite. Change the import and run."""

from horovodlite.training import common
from horovodlite.training.common import *  # noqa: F403

from . import elastic, functions, mpi_ops, pipeline, ps
from . import half_kernels  # noqa: F401  (lends the core torch's half-type kernels)
from .compression import Compression
from .functions import *  # noqa: F403
from .mpi_ops import *  # noqa: F403
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm
from .zero import ZeroOptimizer

# Its own names, the core's that every binding shares, and all of mpi_ops' and functions'.
__all__ = [
    "Compression", "DistributedOptimizer", "SyncBatchNorm", "ZeroOptimizer", "elastic", "pipeline",
    "ps",
]  # fmt: skip
__all__ += common.__all__
__all__ += mpi_ops.__all__
__all__ += functions.__all__
