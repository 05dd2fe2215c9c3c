"""The core names that every binding re-exports unchanged, so each spells them only once.

A binding's `__init__` does `from horovodlite.training.common import *` and starts its
`__all__` with `common.__all__`. The imports below name the core module each comes from
(`init` and `shutdown` move from state to lifecycle with the core's refactor).
"""

from ..asynchronous import start_timeline, stop_timeline
from ..exceptions import HorovodInternalError, HorovodLiteError
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
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
)
from ..version import __version__

# In the order of the imports, each line one core module, so a moved name is one edit.
# fmt: off
__all__ = [
    "start_timeline", "stop_timeline",
    "HorovodInternalError", "HorovodLiteError",
    "Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum",
    "ProcessSet", "add_process_set", "global_process_set", "remove_process_set",
    "ccl_built", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "mpi_built",
    "mpi_enabled", "nccl_built", "rocm_built",
    "cross_rank", "cross_size", "init", "is_homogeneous", "is_initialized", "local_rank",
    "local_size", "mpi_threads_supported", "rank", "shutdown", "size",
    "__version__",
]
# fmt: on
