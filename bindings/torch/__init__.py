"""horovodlite.torch: Horovod's PyTorch API on horovodlite. Change the import and run."""

from horovodlite.training import common
from horovodlite.training.common import *  # noqa: F403

# (half_kernels: importing it lends the core torch's float16 and bfloat16 kernels)
from . import elastic, functions, half_kernels, mpi_ops, pipeline, ps  # noqa: F401
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
