"""Naive all-reduce: the centralised parameter-server baseline.

Every rank sends its whole buffer to the root point-to-point; the root reduces them in rank
order and sends the result back to each rank point-to-point. The root moves (n-1) * N bytes each
way, against the ring's 2(n-1)/n * N per rank: this is the baseline the ring is measured against.
MPI_Reduce + MPI_Bcast are deliberately not used: MPI libraries implement them with trees and
pipelines that would hide the point of the comparison.
"""

from mpi4py import MPI

from ..buffers import wire_type
from ..ops import reduce_into
from .scratch import scratch

__all__ = ["naive_allreduce"]

_TAG_GATHER = 21
_TAG_RESULT = 22
_ROOT = 0


def naive_allreduce(comm, buf, op, xp, segment_bytes: int = 0) -> None:
    """All-reduce the flat contiguous `buf` in place through rank 0 (each buffer in one message)."""
    n = comm.size
    if n == 1 or buf.size == 0:
        return
    wire = wire_type(buf.dtype)
    if comm.rank != _ROOT:
        comm.Send([buf, wire], _ROOT, _TAG_GATHER)
        comm.Recv([buf, wire], _ROOT, _TAG_RESULT)
        return
    incoming = [scratch(xp, buf.dtype, buf.size, slot=source) for source in range(1, n)]
    receives = [
        comm.Irecv([incoming[source - 1], wire], source, _TAG_GATHER) for source in range(1, n)
    ]
    for source in range(1, n):  # in rank order, so the result does not depend on arrival order
        receives[source - 1].Wait()
        reduce_into(xp, buf, incoming[source - 1], op)
    MPI.Request.Waitall([comm.Isend([buf, wire], dest, _TAG_RESULT) for dest in range(1, n)])
