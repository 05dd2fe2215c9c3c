"""All-reduce and reduce-scatter algorithms, and the default choice between them.

Each algorithm is a function on a flat contiguous buffer: `allreduce(comm, buf, op, xp,
segment_bytes)` reduces in place; `reducescatter(comm, buf, bounds, op, xp, segment_bytes)` returns
this rank's chunk. `segment_bytes` (Settings.ring_segment_bytes) caps one message of an algorithm
that pipelines its chunks; the others send each chunk whole and ignore it. The ring's all-reduce
also takes a `pieces.Pieces`: several flat arrays reduced where they lie, as one buffer.

Adasum (adasum.py) is a reduce op with an algorithm of its own, not a choice among these: the
fusion code runs it for op=Adasum, whatever algorithm was asked for.
"""

import itertools

from mpi4py import MPI

from .adasum import ADASUM_DTYPES, adasum_allreduce, is_power_of_two
from .hierarchical import (
    gathers_by_host,
    hierarchical_allgatherv,
    hierarchical_allreduce,
    spans_hosts,
)
from .naive import naive_allreduce
from .native import mpi_allreduce, mpi_reducescatter, supports
from .ring import ring_allgatherv, ring_allreduce, ring_reducescatter

__all__ = [
    "ADASUM_DTYPES",
    "ALLREDUCE",
    "REDUCESCATTER",
    "SMALL_MESSAGE_BYTES",
    "adasum_allreduce",
    "allgatherv",
    "choose",
    "is_power_of_two",
    "requested_algorithm",
    "spans_hosts",
]

ALLREDUCE = {
    "ring": ring_allreduce,
    "naive": naive_allreduce,
    "mpi": mpi_allreduce,
    "hierarchical": hierarchical_allreduce,
}
REDUCESCATTER = {"ring": ring_reducescatter, "mpi": mpi_reducescatter}

# Up to this size the MPI library's own all-reduce (in C) wins: latency dominates; above it the
# ring's bandwidth optimality wins (docs/benchmarks.md, "Crossover and the default choice").
SMALL_MESSAGE_BYTES = 1024 * 1024

# From this result size the all-gather runs around the ring; below it MPI_Allgatherv, whose
# logarithmic algorithms have the lower latency (docs/algorithms.md has the crossover).
RING_ALLGATHER_BYTES = 64 * 1024


def requested_algorithm(algorithm, default=None):
    """Return the algorithm asked for by argument, else `default`; None means choose by size."""
    if algorithm is None:
        return default
    if algorithm != "auto" and algorithm not in ALLREDUCE:
        raise ValueError(
            f"unknown algorithm {algorithm!r}: use one of {', '.join(ALLREDUCE)} or 'auto'"
        )
    return None if algorithm == "auto" else algorithm


def choose(requested, table: dict, nbytes: int, dtype, xp, comm=None) -> str:
    """Return the algorithm to run: `requested` if given, else by message size and topology.

    Above SMALL_MESSAGE_BYTES the default is the hierarchical all-reduce where `comm` spans
    several hosts with several ranks each (faster than the flat ring there: docs/algorithms.md),
    else the ring. Asking about `comm` is collective the first time.
    """
    if requested is not None:
        if requested not in table:
            raise ValueError(
                f"algorithm {requested!r} is not available here: use one of {', '.join(table)}"
            )
        if requested == "mpi" and not supports(dtype, xp):
            return "ring"
        return requested
    if nbytes <= SMALL_MESSAGE_BYTES and supports(dtype, xp):
        return "mpi"
    if nbytes > SMALL_MESSAGE_BYTES and "hierarchical" in table and comm is not None:
        return "hierarchical" if spans_hosts(comm) else "ring"
    return "ring"


def allgatherv(comm, own, out, counts: list, wire, segment_bytes: int, hierarchical) -> None:
    """Gather rank r's `counts[r]` elements into the flat `out`, in rank order.

    `own` is this rank's part, or None where it already sits in `out`. `hierarchical` (the
    HIERARCHICAL_ALLGATHER setting: True, False or None for the default) asks for the gather
    host by host; the default gathers results above SMALL_MESSAGE_BYTES host by host where the
    ranks of each host are consecutive and there are several hosts with several ranks (faster
    than the flat ring there: docs/benchmarks.md), other large results around the ring, and
    small ones with MPI_Allgatherv.
    """
    if hierarchical is None and out.nbytes > SMALL_MESSAGE_BYTES:
        hierarchical = gathers_by_host(comm)
    if hierarchical:
        hierarchical_allgatherv(comm, own, out, counts, wire, segment_bytes)
    elif out.nbytes >= RING_ALLGATHER_BYTES and comm.size > 1:
        ring_allgatherv(comm, own, out, counts, segment_bytes)
    else:
        displacements = [0, *itertools.accumulate(counts[:-1])]
        send = MPI.IN_PLACE if own is None else [own, wire]
        comm.Allgatherv(send, [out, (counts, displacements), wire])
