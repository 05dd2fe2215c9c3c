"""All-reduce and reduce-scatter algorithms, and the default choice between them.

Each algorithm is a function on a flat contiguous buffer: `allreduce(comm, buf, op, xp,
segment_bytes)` reduces in place; `reducescatter(comm, buf, bounds, op, xp, segment_bytes)` returns
this rank's chunk. `segment_bytes` (Settings.ring_segment_bytes) caps one message of an algorithm
that pipelines its chunks; the others send each chunk whole and ignore it.

Adasum (adasum.py) is a reduce op with an algorithm of its own, not a choice among these: the
fusion code runs it for op=Adasum, whatever algorithm was asked for.
"""

from .adasum import ADASUM_DTYPES, adasum_allreduce, is_power_of_two
from .hierarchical import hierarchical_allgatherv, hierarchical_allreduce, spans_hosts
from .naive import naive_allreduce
from .native import mpi_allreduce, mpi_reducescatter, supports
from .ring import ring_allreduce, ring_reducescatter

__all__ = [
    "ADASUM_DTYPES",
    "ALLREDUCE",
    "REDUCESCATTER",
    "SMALL_MESSAGE_BYTES",
    "adasum_allreduce",
    "choose",
    "hierarchical_allgatherv",
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

# Up to this size the MPI library's own all-reduce (in C) wins: latency dominates, and on shared
# memory MPICH beat the Python ring at 2, 3 and 4 ranks up to 1 MiB; above it the ring's bandwidth
# optimality wins. Measured in docs/benchmarks.md (crossover).
SMALL_MESSAGE_BYTES = 1024 * 1024


def requested_algorithm(algorithm, default=None):
    """Return the algorithm asked for by argument, else `default`; None means choose by size."""
    if algorithm is None:
        return default
    if algorithm != "auto" and algorithm not in ALLREDUCE:
        raise ValueError(
            f"unknown algorithm {algorithm!r}: use one of {', '.join(ALLREDUCE)} or 'auto'"
        )
    return None if algorithm == "auto" else algorithm


def choose(requested, table: dict, nbytes: int, dtype, xp) -> str:
    """Return the algorithm to run: `requested` if given, else by message size."""
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
    return "ring"
