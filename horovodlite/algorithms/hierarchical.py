"""Hierarchical collectives: within each host over shared memory, across hosts, within again.

All-reduce (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE), with every local rank owning a slice
rather than one leader per host, so that every rank's link to the other hosts carries a share:
the ranks of a host reduce-scatter the buffer over shared memory (local rank j then holds chunk j
summed over its host), each chunk is ring-all-reduced across the hosts among the ranks that hold
it, and the host's ranks all-gather the chunks. The network carries 2(h-1)/h of the buffer per
host (h hosts), split over its ranks, instead of the flat ring's 2(n-1)/n per rank. Each
element's final value is computed once (by one cross-host ring) and copied, so every rank ends
bitwise equal. It needs more than one host, more than one rank per host and the same number of
ranks on every host; elsewhere it is the flat ring.

All-gather (HOROVOD_HIERARCHICAL_ALLGATHER): each host's leader (local rank 0) gathers its
host's rows over shared memory, the leaders all-gather the hosts' blocks around a ring across the
network, and each leader broadcasts the whole result to its host: each host link carries the
other hosts' rows once, against (n-1) ranks' rows in the flat ring. It needs every host's
ranks to be consecutive in rank order (as launchers place them by default), so that a host's
rows are one block of the result; elsewhere it is the flat ring all-gather.
"""

import itertools
import weakref
from typing import NamedTuple

from mpi4py import MPI

from .ring import allgather_chunks, ring_allgatherv, ring_allreduce, scatter_reduce
from .scratch import chunk_bounds

__all__ = [
    "gathers_by_host",
    "hierarchical_allgatherv",
    "hierarchical_allreduce",
    "spans_hosts",
]


class _Topology(NamedTuple):
    local: MPI.Comm  # this host's ranks, in rank order
    cross: MPI.Comm  # the ranks holding the same local rank on every host
    equal: bool  # every host runs the same number of ranks
    hosts: tuple  # (first rank, ranks) of every host, in rank order, if hosts are consecutive


# Communicator -> its _Topology, or None for one host or one rank on every host. Built at the
# communicator's first hierarchical collective (a collective of all its ranks, as that one is)
# and dropped with it.
_topologies: dict = {}


def _topology(comm):
    key = id(comm)
    if key not in _topologies:
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        cross = comm.Split(color=local.rank, key=comm.rank)
        members = comm.allgather((local.rank, local.size))
        # Decided from what every rank gathered, never from this rank's host alone: with hosts
        # of 2 ranks and 1, all ranks must choose the same way.
        firsts = [rank for rank, (local_rank, _) in enumerate(members) if local_rank == 0]
        if len(firsts) > 1 and max(size for _, size in members) > 1:
            hosts = tuple((first, members[first][1]) for first in firsts)
            consecutive = (
                all(members[first + i][0] == i for first, size in hosts for i in range(size))
                and sum(size for _, size in hosts) == comm.size
            )
            equal = len({size for _, size in members}) == 1
            _topologies[key] = _Topology(local, cross, equal, hosts if consecutive else ())
        else:
            _topologies[key] = None
            local.Free()
            cross.Free()
        weakref.finalize(comm, _topologies.pop, key, None)
    return _topologies[key]


def spans_hosts(comm) -> bool:
    """Whether the hierarchical all-reduce applies to `comm` (collective on first call)."""
    topology = _topology(comm)
    return topology is not None and topology.equal


def hierarchical_allreduce(comm, buf, op, xp, segment_bytes: int) -> None:
    """All-reduce `buf` in place: within hosts, then across them (see the module's text)."""
    if not spans_hosts(comm):
        ring_allreduce(comm, buf, op, xp, segment_bytes)
        return
    local, cross = _topology(comm)[:2]
    bounds = chunk_bounds(buf.size, local.size)
    scatter_reduce(local, buf, bounds, op, xp, segment_bytes)
    lo, hi = bounds[local.rank]
    if hi > lo:  # the same on every host: the hosts' buffers and sizes are equal
        ring_allreduce(cross, buf[lo:hi], op, xp, segment_bytes)
    allgather_chunks(local, buf, bounds, segment_bytes)


def gathers_by_host(comm) -> bool:
    """Whether the hierarchical all-gather applies to `comm` (collective on first call)."""
    topology = _topology(comm)
    return topology is not None and bool(topology.hosts)


def hierarchical_allgatherv(comm, own, out, counts: list, wire, segment_bytes: int) -> None:
    """Gather every rank's `counts[rank]` elements into `out`, in rank order, host by host.

    `own` is this rank's flat part, or None when it already sits at its place in `out`.
    """
    if not gathers_by_host(comm):
        ring_allgatherv(comm, own, out, counts, segment_bytes)
        return
    displacements = [0, *itertools.accumulate(counts[:-1])]
    send = MPI.IN_PLACE if own is None else [own, wire]
    local, cross, _, hosts = _topology(comm)
    first = comm.rank - local.rank
    base = displacements[first]
    host = slice(first, first + local.size)
    block = out[base : base + sum(counts[host])]
    mine = [block, (counts[host], [d - base for d in displacements[host]]), wire]
    if local.rank == 0:
        local.Gatherv(send, mine, root=0)
        host_counts = [sum(counts[f : f + size]) for f, size in hosts]
        ring_allgatherv(cross, None, out, host_counts, segment_bytes)
    else:
        if own is None:
            own = out[displacements[comm.rank] : displacements[comm.rank] + counts[comm.rank]]
        local.Gatherv([own, wire], None, root=0)
    local.Bcast([out, wire], root=0)
