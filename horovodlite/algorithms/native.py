"""The MPI library's own collectives (MPI_Allreduce, MPI_Reduce_scatter).

Types the MPI standard cannot reduce portably (float16, bfloat16, bool) use a user-defined
MPI op that reduces with numpy, created once per dtype and op.
"""

import functools

import numpy as np
from mpi4py import MPI

from ..buffers import native_mpi_type, wire_type
from ..ops import ReduceOp, reduce_into
from ..result_memory import new_array

__all__ = ["MPI_OPS", "mpi_allreduce", "mpi_reducescatter", "supports"]

MPI_OPS = {  # the MPI library's op for each ReduceOp it can apply itself (Average: a Sum)
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}


@functools.cache
def _user_op(dtype: np.dtype, op: ReduceOp) -> MPI.Op:
    def combine(inbuf, inoutbuf, datatype):
        acc = np.frombuffer(inoutbuf, dtype=dtype)
        reduce_into(np, acc, np.frombuffer(inbuf, dtype=dtype), op)

    return MPI.Op.Create(combine, commute=True)


def _datatype_and_op(dtype: np.dtype, op: ReduceOp):
    mpi_type = native_mpi_type(dtype)
    if mpi_type is not None:
        return mpi_type, MPI_OPS[op]
    return wire_type(dtype), _user_op(dtype, op)


def supports(dtype: np.dtype, xp) -> bool:
    """Return whether the MPI library can reduce `dtype` for arrays of module `xp`."""
    # A user-defined op runs on the host, so device arrays need a type MPI reduces natively.
    return xp is np or native_mpi_type(dtype) is not None


def mpi_allreduce(comm, buf, op, xp, segment_bytes: int = 0, source=None) -> None:
    """All-reduce the flat contiguous `buf` with MPI_Allreduce (it segments itself): in place,
    or from the flat `source` into `buf`."""
    if comm.size == 1 or buf.size == 0:
        if source is not None:
            buf[...] = source
        return
    mpi_type, mpi_op = _datatype_and_op(buf.dtype, op)
    send = MPI.IN_PLACE if source is None else [source, mpi_type]
    comm.Allreduce(send, [buf, mpi_type], mpi_op)


def mpi_reducescatter(comm, buf, bounds, op, xp, segment_bytes: int = 0):
    """Reduce `buf` across ranks with MPI_Reduce_scatter; return this rank's chunk."""
    lo, hi = bounds[comm.rank]
    out = new_array(xp, hi - lo, buf.dtype)
    if comm.size == 1:
        out[...] = buf[lo:hi]
        return out
    mpi_type, mpi_op = _datatype_and_op(buf.dtype, op)
    counts = [b - a for a, b in bounds]
    comm.Reduce_scatter([buf, mpi_type], [out, mpi_type], counts, mpi_op)
    return out
