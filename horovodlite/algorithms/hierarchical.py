"""Hierarchical all-reduce: reduce within each host, all-reduce across hosts, share within hosts.

Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE, with every local rank owning a slice rather than one
leader per host, so that every rank's link to the other hosts carries a share: the ranks of a
host reduce-scatter the buffer over shared memory (local rank j then holds chunk j summed over
its host), each chunk is ring-all-reduced across the hosts among the ranks that hold it, and the
host's ranks all-gather the chunks. The network carries 2(h-1)/h of the buffer per host (h
hosts), split over its ranks, instead of the flat ring's 2(n-1)/n per rank. Each element's final
value is computed once (by one cross-host ring) and copied, so every rank ends bitwise equal.

It needs a job whose hosts run the same number of ranks, more than one host and more than one
rank per host; elsewhere it is the flat ring.
"""

import weakref

from mpi4py import MPI

from .ring import allgather_chunks, ring_allreduce, scatter_reduce
from .scratch import chunk_bounds

__all__ = ["hierarchical_allreduce"]

# Communicator -> (its ranks on this host, the ranks holding the same local slot on every host),
# or None where the hierarchy does not apply. Built at a communicator's first hierarchical
# all-reduce (a collective of all its ranks, as that all-reduce is) and dropped with it.
_topologies: dict = {}


def _topology(comm):
    key = id(comm)
    if key not in _topologies:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        cross = comm.Split(color=local.rank, key=comm.rank)
        sizes = comm.allgather(local.size)
        if 1 < local.size < comm.size and len(set(sizes)) == 1:
            _topologies[key] = (local, cross)
        else:
            _topologies[key] = None
            local.Free()
            cross.Free()
        weakref.finalize(comm, _topologies.pop, key, None)
    return _topologies[key]


def hierarchical_allreduce(comm, buf, op, xp, segment_bytes: int) -> None:
    """All-reduce `buf` in place: within hosts, then across them (see the module's text)."""
    topology = _topology(comm)
    if topology is None:
        ring_allreduce(comm, buf, op, xp, segment_bytes)
        return
    local, cross = topology
    bounds = chunk_bounds(buf.size, local.size)
    scatter_reduce(local, buf, bounds, op, xp, segment_bytes)
    lo, hi = bounds[local.rank]
    if hi > lo:  # the same on every host: the hosts' buffers and sizes are equal
        ring_allreduce(cross, buf[lo:hi], op, xp, segment_bytes)
    allgather_chunks(local, buf, bounds, segment_bytes)
