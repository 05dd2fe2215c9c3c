"""Ring all-reduce: a scatter-reduce followed by an all-gather around the ring of ranks.

With n ranks and N bytes, each rank sends 2(n-1)/n * N bytes in 2(n-1) steps: the
bandwidth-optimal schedule. Each chunk's final value is computed by exactly one rank and then
copied, so every rank ends with bitwise-identical results.
"""

from mpi4py import MPI

from ..buffers import wire_type
from ..ops import reduce_into
from .scratch import chunk_bounds, scratch

__all__ = ["ring_allreduce", "ring_reducescatter", "scatter_reduce", "allgather_chunks"]

_TAG_SCATTER_REDUCE = 11
_TAG_ALLGATHER = 12


def _segments(start: int, stop: int, step: int):
    return [(lo, min(lo + step, stop)) for lo in range(start, stop, step)] or [(start, start)]


def scatter_reduce(comm, buf, bounds, op, xp, segment_bytes: int) -> None:
    """Reduce chunk `bounds[r]` of every rank's `buf` into rank r's `buf`, in n-1 steps.

    At step s rank r sends chunk r-s-1 to its right neighbour and receives chunk r-s-2 from its
    left, adding it to its own; after n-1 steps chunk r holds the reduction over all ranks.
    """
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    wire = wire_type(buf.dtype)
    # Large chunks travel as segments so that reducing one overlaps receiving the next.
    segment = max(1, segment_bytes // buf.dtype.itemsize)
    incoming = scratch(xp, buf.dtype, max(hi - lo for lo, hi in bounds))
    for step in range(n - 1):
        send_lo, send_hi = bounds[(r - step - 1) % n]
        recv_lo, recv_hi = bounds[(r - step - 2) % n]
        recv_segments = _segments(recv_lo, recv_hi, segment)
        receives = [
            comm.Irecv([incoming[lo - recv_lo : hi - recv_lo], wire], left, _TAG_SCATTER_REDUCE)
            for lo, hi in recv_segments
        ]
        sends = [
            comm.Isend([buf[lo:hi], wire], right, _TAG_SCATTER_REDUCE)
            for lo, hi in _segments(send_lo, send_hi, segment)
        ]
        for (lo, hi), request in zip(recv_segments, receives):
            request.Wait()
            reduce_into(xp, buf[lo:hi], incoming[lo - recv_lo : hi - recv_lo], op)
        MPI.Request.Waitall(sends)


def allgather_chunks(comm, buf, bounds) -> None:
    """Give every rank all chunks, where rank r starts with chunk `bounds[r]`, in n-1 steps."""
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    wire = wire_type(buf.dtype)
    for step in range(n - 1):
        send_lo, send_hi = bounds[(r - step) % n]
        recv_lo, recv_hi = bounds[(r - step - 1) % n]
        comm.Sendrecv(
            [buf[send_lo:send_hi], wire],
            right,
            _TAG_ALLGATHER,
            [buf[recv_lo:recv_hi], wire],
            left,
            _TAG_ALLGATHER,
        )


def ring_allreduce(comm, buf, op, xp, segment_bytes: int) -> None:
    """All-reduce the flat contiguous `buf` in place with the ring algorithm."""
    if comm.size == 1 or buf.size == 0:
        return
    bounds = chunk_bounds(buf.size, comm.size)
    scatter_reduce(comm, buf, bounds, op, xp, segment_bytes)
    allgather_chunks(comm, buf, bounds)


def ring_reducescatter(comm, buf, bounds, op, xp, segment_bytes: int):
    """Reduce `buf` across ranks and return this rank's chunk `bounds[rank]` (a view of buf)."""
    if comm.size > 1:
        scatter_reduce(comm, buf, bounds, op, xp, segment_bytes)
    lo, hi = bounds[comm.rank]
    return buf[lo:hi]
