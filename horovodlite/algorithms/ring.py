"""Ring all-reduce: a scatter-reduce followed by an all-gather around the ring of ranks.

With n ranks and N bytes, each rank sends 2(n-1)/n * N bytes in 2(n-1) steps: the
bandwidth-optimal schedule. Each chunk's final value is computed by exactly one rank and then
copied, so every rank ends with bitwise-identical results.

The 2(n-1) steps run as one pipeline. At step t rank r sends chunk r-t-1 to its right neighbour
and receives chunk r-t-2 from its left (adding it to its own during the scatter-reduce, the first
n-1 steps; storing it during the all-gather), so what a rank sends at step t+1 is what it
received at step t. Chunks travel as segments, and each segment goes on to the right as soon as
it has arrived and been reduced, while the rest of the step is still on the wire: the link never
waits for a whole step to finish, nor for Python to reduce the step's last segment.

A `finish` (an average's division) runs on each segment of a rank's own chunk as its reduction
completes, while it is still in cache, before it goes around: each rank finishes 1/n of the
buffer instead of all of it after the ring, and every rank still ends with the same bits.

How a rank waits for a segment depends on where its neighbours are. On one host MPI's own wait
spins: a segment over shared memory takes microseconds. Across hosts the same spin would burn a
core for the whole transfer (MPICH polls its network until the data is there), a core the
training's computation needs wherever ranks share cores; so there the ring tests its requests
between short sleeps, which costs a few percent of a core and a little latency.
"""

import itertools
import os
import time
import weakref

from mpi4py import MPI

from ..buffers import synchronize_device, wire_type
from ..hosts import one_host
from ..ops import reduce_into
from .pieces import Pieces, parts
from .scratch import chunk_bounds, scratch

__all__ = [
    "allgather_chunks",
    "ring_allgatherv",
    "ring_allreduce",
    "ring_reducescatter",
    "scatter_reduce",
]

_TAG_RING = 11


def _segments(start: int, stop: int, step: int, cuts=()):
    """Split [start, stop) into segments of at most `step` elements, also at every cut."""
    borders = [start, *(cut for cut in cuts if start < cut < stop), stop]
    segments = [
        (lo, min(lo + step, end))
        for begin, end in itertools.pairwise(borders)
        for lo in range(begin, end, step)
    ]
    return segments or [(start, start)]


# A request that crosses the network is tested, yielding the core between tests, for
# _SPIN_SECONDS (on a fast link a segment arrives within it), then between sleeps that double up
# to _MAX_SLEEP. The sleeps stay short because MPI moves data only while it is called: a test
# refills the socket's buffer, which a slow link drains in a millisecond or two; sleeps that grew
# with the wait left the link idle (figures: docs/benchmarks.md, "Figures behind the code's
# constants").
_SPIN_SECONDS, _FIRST_SLEEP, _MAX_SLEEP = 200e-6, 20e-6, 200e-6

# Communicator -> whether all its ranks share one host; learnt at its first ring (a collective
# of all its ranks, as the ring is), dropped with the communicator.
_on_one_host: dict = {}


def _waits_for(comm):
    """Return (wait(request), wait_all(requests)) for ring requests on `comm` (see the module
    text): MPI's own where the ranks share a host, else tests between sleeps."""
    key = id(comm)
    if key not in _on_one_host:
        _on_one_host[key] = one_host(comm)
        weakref.finalize(comm, _on_one_host.pop, key, None)
    if _on_one_host[key]:
        return MPI.Request.Wait, MPI.Request.Waitall
    return _network_wait, _network_wait_all


def _network_wait(request) -> None:
    if request.Test():
        return
    start = time.perf_counter()
    while time.perf_counter() - start < _SPIN_SECONDS:
        os.sched_yield()
        if request.Test():
            return
    delay = _FIRST_SLEEP
    while not request.Test():
        time.sleep(delay)
        delay = min(2 * delay, _MAX_SLEEP)


def _network_wait_all(requests) -> None:
    for request in requests:
        _network_wait(request)


def _ring_steps(comm, buf, bounds, op, xp, segment_bytes: int, first: int, last: int,
                finish=None) -> None:  # fmt: skip
    """Run steps `first` to `last - 1` of the 2(n-1) ring steps on `buf` (see the module text).

    `buf` is one flat array or a `Pieces` (pieces.py), cut into segments at its pieces' borders.
    Steps below n-1 reduce what they receive; the others store it. One receive-ahead: a step's
    receives are posted when the step before it starts, into the other of two scratch buffers.
    """
    n, r = comm.size, comm.rank
    if first >= last:
        return
    wait, wait_all = _waits_for(comm)
    right, left = (r + 1) % n, (r - 1) % n
    wire = wire_type(buf.dtype)
    segment = max(1, segment_bytes // buf.dtype.itemsize)
    cuts = buf.cuts if isinstance(buf, Pieces) else ()
    if first < n - 1:
        longest = max(hi - lo for lo, hi in bounds)
        incoming = [scratch(xp, buf.dtype, longest, slot) for slot in (0, 1)]
    sending = []  # (lo, hi, request) of every send that may still read buf[lo:hi]

    def received_segments(t):
        return _segments(*bounds[(r - t - 2) % n], segment, cuts)

    def wait_sends_reading(lo, hi):
        # A receive must not overwrite what a send still reads (the all-gather writes into the
        # chunks that the scatter-reduce sent from).
        still = []
        for send in sending:
            if send[0] < hi and lo < send[1]:
                wait(send[2])
            else:
                still.append(send)
        sending[:] = still

    def post_receives(t):
        if t >= last:
            return []
        requests = []
        for lo, hi in received_segments(t):
            if t < n - 1:
                start = bounds[(r - t - 2) % n][0]
                target = incoming[t % 2][lo - start : hi - start]
            else:
                wait_sends_reading(lo, hi)
                target = buf[lo:hi]
            requests.append(comm.Irecv([target, wire], left, _TAG_RING))
        return requests

    def send(lo, hi):
        sending.append((lo, hi, comm.Isend([buf[lo:hi], wire], right, _TAG_RING)))

    for lo, hi in _segments(*bounds[(r - first - 1) % n], segment, cuts):
        send(lo, hi)
    receives = post_receives(first)
    for t in range(first, last):
        ahead = post_receives(t + 1)
        start = bounds[(r - t - 2) % n][0]
        for (lo, hi), request in zip(received_segments(t), receives):
            wait(request)
            if t < n - 1:
                reduce_into(xp, buf[lo:hi], incoming[t % 2][lo - start : hi - start], op)
                if t == n - 2 and finish is not None:  # this rank's own chunk, now complete
                    finish(buf[lo:hi])
                synchronize_device(xp)  # MPI reads the segment next: a GPU must be done with it
            if t + 1 < last:
                send(lo, hi)  # what arrived at step t leaves at step t+1
        receives = ahead
    wait_all([request for _, _, request in sending])


def scatter_reduce(comm, buf, bounds, op, xp, segment_bytes: int) -> None:
    """Reduce chunk `bounds[r]` of every rank's `buf` into rank r's `buf`, in n-1 steps."""
    _ring_steps(comm, buf, bounds, op, xp, segment_bytes, 0, comm.size - 1)


def allgather_chunks(comm, buf, bounds, segment_bytes: int) -> None:
    """Give every rank all chunks, where rank r starts with chunk `bounds[r]`, in n-1 steps."""
    n = comm.size
    _ring_steps(comm, buf, bounds, None, None, segment_bytes, n - 1, 2 * (n - 1))


def ring_allgatherv(comm, own, out, counts, segment_bytes: int) -> None:
    """Gather rank r's `counts[r]` elements into the flat `out`, in rank order, around the ring.

    `own` is this rank's part, or None where it already sits at its place in `out`. Each rank
    sends (n-1)/n of the result, as MPI_Allgather's ring does; MPICH's MPI_Allgatherv was 1.3 to
    5x slower than this on shared memory and capped links from 256 KiB (docs/algorithms.md).
    """
    bounds, start = [], 0
    for count in counts:
        bounds.append((start, start + count))
        start += count
    if own is not None:
        lo, hi = bounds[comm.rank]
        out[lo:hi] = own
    allgather_chunks(comm, out, bounds, segment_bytes)


def ring_allreduce(comm, buf, op, xp, segment_bytes: int, finish=None) -> None:
    """All-reduce `buf` in place with the ring algorithm: a flat contiguous array, or a
    `Pieces` of them (pieces.py), all-reduced where they lie as if they were one.

    `finish`, if given, is called in place on every part of the reduced buffer exactly once
    (on one rank, whose result the others receive), before the ring ends.
    """
    if comm.size == 1 or buf.size == 0:
        if finish is not None:
            for part in parts(buf):
                finish(part)
        return
    bounds = chunk_bounds(buf.size, comm.size)
    _ring_steps(comm, buf, bounds, op, xp, segment_bytes, 0, 2 * (comm.size - 1), finish)


def ring_reducescatter(comm, buf, bounds, op, xp, segment_bytes: int):
    """Reduce `buf` across ranks and return this rank's chunk `bounds[rank]` (a view of buf)."""
    if comm.size > 1:
        scatter_reduce(comm, buf, bounds, op, xp, segment_bytes)
    lo, hi = bounds[comm.rank]
    return buf[lo:hi]
