"""The core names that every binding re-exports unchanged, so each spells them only once.

A binding's `__init__` (and the core's own) does `from horovodlite.training.common import *`
and builds its `__all__` from `common.__all__`. The imports below name the core module each
comes from.
"""

from ..asynchronous import start_timeline, stop_timeline
from ..exceptions import HorovodInternalError, HorovodLiteError, HostsUpdatedInterrupt
from ..lifecycle import init, shutdown
from ..ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from ..runtime import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    nccl_built,
    rocm_built,
)
from ..state import (
    cross_rank,
    cross_size,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    size,
)
from ..version import __version__

# In the order of the imports, each line one core module, so a moved name is one edit.
# fmt: off
__all__ = [
    "start_timeline", "stop_timeline",
    "HorovodInternalError", "HorovodLiteError", "HostsUpdatedInterrupt",
    "init", "shutdown",
    "Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum",
    "ProcessSet", "add_process_set", "global_process_set", "remove_process_set",
    "ccl_built", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "mpi_built",
    "mpi_enabled", "nccl_built", "rocm_built",
    "cross_rank", "cross_size", "is_homogeneous", "is_initialized", "local_rank",
    "local_size", "mpi_threads_supported", "rank", "size",
    "__version__",
]
# fmt: on
