"""horovodlite: data-parallel training collectives over MPI, in pure Python."""

from .buffers import cuda_aware_mpi
from .collectives import (
    allgather,
    allgather_object,
    allreduce,
    allreduce_,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    broadcast_object,
    grouped_allreduce,
    reducescatter,
)
from .exceptions import HorovodInternalError, HorovodLiteError, MismatchError, NotInitializedError
from .ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .runtime import (
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
from .state import (
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
from .version import __version__

__all__ = [
    "__version__",
    # process state
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported",
    # build facts
    "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "nccl_built", "ccl_built",
    "ddl_built", "rocm_built", "cuda_built", "cuda_aware_mpi",
    # collectives
    "allreduce", "allreduce_", "reducescatter", "broadcast", "broadcast_", "allgather",
    "alltoall", "grouped_allreduce", "barrier", "broadcast_object", "allgather_object",
    # reduce ops
    "ReduceOp", "Average", "Sum", "Min", "Max", "Product", "Adasum",
    # process sets
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    # errors
    "HorovodLiteError", "HorovodInternalError", "MismatchError", "NotInitializedError",
]  # fmt: skip
