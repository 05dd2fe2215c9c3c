"""All-reduce as the synchronous path and the engine share it: one or many arrays, one buffer.

`fused_allreduce` packs compatible all-reduces (equal `FusionEntry.key`) into one fusion
buffer, runs one algorithm on it, and hands each caller its part. A single all-reduce is the
case of one entry, so the synchronous call and the engine's fused batches run the same code.

Where the ring moves a fused batch of host arrays, the large in-place ones are reduced where
they lie, with no copy in or out; only runs of small arrays go through the fusion buffer
(`_ring_where_they_lie`, algorithms/pieces.py). Other algorithms take one contiguous buffer: a
batch of in-place host arrays that already lie back to back in memory, in the batch's order (the
order rank 0 submitted them in, engine._exchange), is that buffer. Either way every rank cuts
and orders the batch alike, by the agreed sizes only, so ranks whose arrays lie differently
still reduce the same elements together.
"""

import ctypes
import functools
import itertools
from contextlib import nullcontext

import numpy as np

from . import algorithms
from .agreement import array_fields
from .algorithms.pieces import Pieces
from .algorithms.scratch import scratch
from .buffers import DTYPES_BY_NAME, device_module, synchronize_device
from .ops import ReduceOp
from .staging import deliver, flat_work, scale, scaled_copy, staged
from .state import current
from .transport import select

__all__ = ["FusionEntry", "allreduce_fields", "fused_allreduce", "fused_by_kind", "zeros_entry"]


class FusionEntry:
    """One all-reduce as the fusion code sees it: its input, and how to return its result."""

    def __init__(self, array, xp, inplace, op, prescale, postscale, requested):
        self.array, self.xp, self.inplace = array, xp, inplace
        self.op, self.prescale, self.postscale, self.requested = op, prescale, postscale, requested
        # All-reduces with equal keys can share one fusion buffer and one collective.
        self.key = (array.dtype, op, prescale, postscale, requested, xp.__name__)


def zeros_entry(fields: dict) -> FusionEntry:
    """Return the all-reduce of zeros a joined rank runs in place of one it never made."""
    xp = device_module(fields["device"])
    zeros = xp.zeros(fields["shape"], dtype=DTYPES_BY_NAME[fields["dtype"]])
    return FusionEntry(
        zeros,
        xp,
        False,
        ReduceOp[fields["op"]],
        fields["prescale_factor"],
        fields["postscale_factor"],
        fields["algorithm"],
    )


def allreduce_fields(name, array, op, prescale, postscale, requested, on_host: bool) -> dict:
    """Return what the ranks must agree on for an all-reduce (agreement.py)."""
    return array_fields(
        "allreduce",
        name,
        array,
        op=getattr(op, "name", None),
        prescale_factor=float(prescale),
        postscale_factor=float(postscale),
        algorithm=requested,
        device="cpu" if on_host else "cuda",
    )


def fused_allreduce(comm, entries: list, segment_bytes: int, timeline=None) -> list:
    """All-reduce `entries` (equal keys) as one buffer; return their results in order.

    `segment_bytes` is Settings.ring_segment_bytes. `timeline`, if given, is called as
    `timeline(phase)` and returns a context manager that records the phase (the engine passes
    its Chrome-trace recorder).
    """
    span = timeline or (lambda phase: nullcontext())
    first = entries[0]
    dtype, xp = first.array.dtype, first.xp
    # What moves the buffer (transport.py): MPI by default; an Adasum stays on MPI.
    transport = select(current().settings, xp, first.op, dtype)
    module = np if staged(xp, transport) else xp
    nbytes = sum(entry.array.nbytes for entry in entries)
    # MPI names its algorithm (ring, mpi, ...), the other transports themselves (gloo, nccl):
    # the timeline's ALLREDUCE_<name> says what moved the buffer.
    chosen = (
        "adasum"
        if first.op == ReduceOp.ADASUM
        else transport.allreduce_algorithm(first.requested, nbytes, dtype, module, comm)
    )
    divisor = comm.size if first.op == ReduceOp.AVERAGE else 1
    factor = first.postscale / divisor
    # Every rank takes this branch or none: its terms are agreed (sizes, dtype, device, op).
    if chosen == "ring" and len(entries) > 1 and comm.size > 1 and xp is np:
        return _ring_where_they_lie(comm, entries, transport, factor, span)
    adjacent = adjacent_span(entries) if len(entries) > 1 else None
    fresh = False
    if len(entries) == 1:
        buf, module = flat_work(first.array, xp, not first.inplace, transport)
    elif adjacent is not None:
        buf, module = adjacent, xp
    else:
        total = sum(entry.array.size for entry in entries)
        fresh = not any(entry.inplace for entry in entries)  # (see _ring_where_they_lie)
        buf = module.empty(total, dtype=dtype) if fresh else scratch(module, dtype, total, "fusion")
        with span("MEMCPY_IN_FUSION_BUFFER"):
            parts = [flat_work(entry.array, xp, False, transport)[0] for entry in entries]
            module.concatenate(parts, out=buf)  # one call, not one slice assignment each
        synchronize_device(module)
    # Results copied out of the buffer take the factor on the way (one pass over the data, not
    # two): all but a single entry's, adjacent ones' and a fresh buffer's (results are the
    # buffer), which the collective scales as it finishes.
    scaled_out = len(entries) > 1 and adjacent is None and not fresh
    scaling = not scaled_out and factor != 1.0
    finish = functools.partial(scale, module, factor=factor) if scaling else None
    if first.op == ReduceOp.ADASUM:
        # Adasum's dot products are per tensor, as Horovod's: the buffer travels fused, and
        # each entry's part is combined by its own angle.
        bounds = _bounds(entries)

        def run():
            algorithms.adasum_allreduce(comm, buf, first.op, module, segment_bytes, parts=bounds)
            if finish is not None:
                finish(buf)
    else:
        run = functools.partial(transport.allreduce, comm, buf, first.op, module, chosen, finish)
    with span(f"ALLREDUCE_{chosen.upper()}"):
        scale(module, buf, first.prescale)
        run()
    if len(entries) == 1:
        return [deliver(buf, first.array, xp, first.inplace)]
    if adjacent is not None:
        return [entry.array for entry in entries]  # reduced where they lie
    results, offset = [], 0
    with span("MEMCPY_OUT_FUSION_BUFFER"):
        for entry in entries:
            part = buf[offset : offset + entry.array.size]
            offset += entry.array.size
            if scaled_out:
                # The scratch buffer is reused, so out-of-place results beside in-place ones
                # need memory of their own.
                target = entry.array if entry.inplace and module is xp else None
                part = scaled_copy(module, part, factor, target)
            results.append(deliver(part, entry.array, xp, entry.inplace))
    return results


# In a fused batch that the ring moves, host arrays of at least this size are each a piece of
# their own: reduced where they lie if in place, never copied. Runs of smaller ones share a
# piece, in the fusion buffer unless they lie back to back, so that their messages stay large
# enough to fill the link. For ResNet-50's 161 gradients, 42 arrays of 98.8% of the bytes lie
# at or above it.
ALONE_BYTES = 256 << 10


def _ring_where_they_lie(comm, entries: list, transport, factor: float, span) -> list:
    """All-reduce host `entries` with the ring as one `Pieces` buffer (algorithms/pieces.py):
    each piece where it lies if its in-place arrays lie back to back (a large array alone
    always does), else through the fusion buffer.

    Every rank cuts the buffer into the same pieces, decided by the agreed sizes alone, so the
    ranks' segments match whatever lies where on each rank.
    """
    first = entries[0]
    groups = _piece_groups(entries)
    lying = [adjacent_span(group) for group in groups]  # each piece's own memory, or None
    copied = [entry for group, own in zip(groups, lying) if own is None for entry in group]
    # Out-of-place results can be views of the fusion buffer if it is a new one each time.
    # That saves copying every result out, more than the new buffer's first touch costs over
    # the reused scratch buffer: ResNet-50's 161 gradients at 2 and 3 ranks went from 1.37x and
    # 1.29x one buffer's all-reduce time to 1.18x (docs/engine.md).
    fresh = not any(entry.inplace for entry in entries)
    total = sum(entry.array.size for entry in copied)
    dtype = first.array.dtype
    buf = np.empty(total, dtype=dtype) if fresh else scratch(np, dtype, total, "fusion")
    if copied:
        with span("MEMCPY_IN_FUSION_BUFFER"):
            np.concatenate([entry.array.reshape(-1) for entry in copied], out=buf)
    arrays, offset = [], 0
    for group, own in zip(groups, lying):
        if own is None:
            own = buf[offset : offset + sum(entry.array.size for entry in group)]
            offset += own.size
        arrays.append(own)
    pieces = Pieces(arrays)
    finish = functools.partial(scale, np, factor=factor) if factor != 1.0 else None
    with span("ALLREDUCE_RING"):
        for array in arrays:
            scale(np, array, first.prescale)
        transport.allreduce(comm, pieces, first.op, np, "ring", finish)
    if not copied:
        return [entry.array for entry in entries]  # reduced where they lie
    results, offset = [], 0
    with span("MEMCPY_OUT_FUSION_BUFFER"):
        for group, own in zip(groups, lying):
            for entry in group:
                if own is not None:
                    results.append(entry.array)
                    continue
                part = buf[offset : offset + entry.array.size]
                offset += entry.array.size
                if not entry.inplace and not fresh:
                    part = part.copy()  # the scratch buffer is reused: results need their own
                results.append(deliver(part, entry.array, np, entry.inplace))
    return results


def _piece_groups(entries: list) -> list:
    """Return `entries` in runs, one per piece: each large one alone, runs of small ones."""
    groups: list = []
    for entry in entries:
        if _large(entry) or not groups or _large(groups[-1][-1]):
            groups.append([entry])
        else:
            groups[-1].append(entry)
    return groups


def _large(entry) -> bool:
    return entry.array.nbytes >= ALONE_BYTES


def adjacent_span(entries: list):
    """Return one host array over the in-place `entries`' arrays if they lie back to back in
    memory in this order (C-contiguous, each starting where the one before ends); else None."""
    if not all(entry.inplace and entry.xp is np for entry in entries):
        return None
    if len(entries) == 1:
        array = entries[0].array
        return array.reshape(-1) if array.flags.c_contiguous and array.flags.writeable else None
    start = end = entries[0].array.ctypes.data
    for entry in entries:
        array = entry.array
        if not array.flags.c_contiguous or not array.flags.writeable or array.ctypes.data != end:
            return None
        end += array.nbytes
    # The entries' arrays keep the memory alive for as long as the collective runs.
    memory = (ctypes.c_char * (end - start)).from_address(start)
    return np.frombuffer(memory, dtype=entries[0].array.dtype)


def _bounds(entries: list) -> tuple:
    """Return the (start, stop) offsets of `entries` in their fusion buffer."""
    stops = list(itertools.accumulate(entry.array.size for entry in entries))
    return tuple(zip([0, *stops[:-1]], stops))


def fused_by_kind(comm, entries: list, segment_bytes: int) -> list:
    """All-reduce `entries` of any dtypes: one fused buffer per kind, results in order."""
    kinds: dict = {}  # fusion key -> positions, in order
    for i, entry in enumerate(entries):
        kinds.setdefault(entry.key, []).append(i)
    results = [None] * len(entries)
    for positions in kinds.values():
        fused = fused_allreduce(comm, [entries[i] for i in positions], segment_bytes)
        for i, result in zip(positions, fused):
            results[i] = result
    return results
