"""All-reduce, one array or a fused batch: decide once where every byte lies, then move it.

The synchronous path (one entry) and the engine (a fused batch of entries with equal
`FusionEntry.key`) share `fused_allreduce`. It makes one decision per batch, a `Layout`:

- which arrays are reduced where they lie (in place, C-contiguous, writeable, back to back in
  the batch's order; a large one alone always qualifies where the ring takes `Pieces`),
- which are copied into the fusion buffer, once, with the prescale applied on the way in,
- how each result comes back: the array itself, a view of a new buffer (out-of-place results
  need memory of their own, and a new buffer gives it without a copy out), or a copy back into
  an in-place array that did not lie where it could be reduced,
- for a single out-of-place array, the input is handed to the transport beside a new result
  buffer: MPI's own all-reduce and CuPy's NCCL read it as their separate send buffer, with no
  copy in; a transport or algorithm that reduces in place (the ring, torch's groups) copies it
  into the result buffer first (`transport.reduce_into`),
- where the result factor (postscale, over the set's size for Average: ops.result_factor) is
  applied: by the transport as each part of the reduction completes, or on the copy back where
  every result is copied back anyway.

Then the transport moves the layout's pieces. Every rank cuts and orders the batch alike, by
the agreed sizes only, so ranks whose arrays lie differently still reduce the same elements
together. GPU arrays on a transport that carries no GPU buffers are staged through host
memory: a reused buffer, pinned where CuPy can pin it, a large batch in pieces whose copies
overlap the transfer (staging.py).

A batch of a framework's tensors that its transport moves as they are (`TensorEntry`: torch's on
gloo and NCCL) skips the layout: one buffer of the framework's, filled in one call, moved, and
split back by the binding's TensorKind (tensor_kind.py); a batch that mixes them with arrays
goes the general way through their views.
"""

import ctypes
import dataclasses
import itertools
from contextlib import nullcontext
from typing import Optional

import numpy as np

from . import algorithms
from .agreement import array_fields
from .algorithms.pieces import Pieces
from .algorithms.scratch import scratch
from .buffers import DTYPES_BY_NAME, array_module, cupy_holds, device_module, synchronize_device
from .ops import ReduceOp, combined_as, result_factor
from .result_memory import new_array
from .staging import (
    copy_in,
    hand_back,
    host_scratch,
    in_pieces,
    scale,
    staged,
    through_host_in_pieces,
)
from .state import current
from .tensor_kind import device_tensors
from .transport import ON_DEVICE, select

__all__ = [
    "FusionEntry",
    "TensorEntry",
    "Layout",
    "allreduce_fields",
    "fused_allreduce",
    "fused_by_kind",
    "fusion_key",
    "lay_out",
    "reduce_tensor",
    "zeros_entry",
]


class FusionEntry:
    """One all-reduce as the fusion code sees it: its input, and how to return its result.

    `key` is `fusion_key(...)` of the same arguments, passed by a caller that keeps it from an
    earlier call with them (the plan templates).
    """

    __slots__ = ("array", "xp", "inplace", "op", "prescale", "postscale", "requested", "key")

    def __init__(self, array, xp, inplace, op, prescale, postscale, requested, key=None):
        self.array, self.xp, self.inplace = array, xp, inplace
        self.op, self.prescale, self.postscale, self.requested = op, prescale, postscale, requested
        self.key = key or fusion_key(array.dtype, op, prescale, postscale, requested, xp)

    def __call__(self, comm, payloads=None):
        """Run this all-reduce alone and return its result: an all-reduce plan's `execute`.

        (The entry itself, where a closure would make three more objects for Python's garbage
        collector on every call: a backward pass makes one plan per gradient.)
        """
        return fused_allreduce(comm, [self])[0]


class TensorEntry(FusionEntry):
    """An all-reduce of a framework's tensor that its transport moves as it is (tensor_kind.py).

    `array` is the tensor itself, `kind` its binding's TensorKind, `dtype` its numpy dtype and
    `xp` numpy for a host tensor, else transport.ON_DEVICE; `key` is the fusion key its numpy or
    CuPy view would have, so that it fuses with arrays on the general way (the ranks batch
    alike whichever way each of them takes).
    """

    __slots__ = ("kind", "dtype")

    def __init__(self, tensor, kind, dtype, xp, inplace, op, prescale, postscale, requested, key):
        # (FusionEntry's fields set here, not by its __init__: one call less a gradient)
        self.array, self.xp, self.inplace, self.key = tensor, xp, inplace, key
        self.op, self.prescale, self.postscale, self.requested = op, prescale, postscale, requested
        self.kind, self.dtype = kind, dtype


def fusion_key(dtype, op, prescale, postscale, requested, xp) -> tuple:
    """Return the key of an all-reduce: those with equal keys can share one fusion buffer and
    one collective. Equal keys are one object (buckets.into_batches compares them by identity).
    `xp` is numpy for host data, else CuPy or transport.ON_DEVICE: GPU data fuses alike
    whether it goes as CuPy arrays or as a framework's tensors.
    """
    key = (dtype, op, prescale, postscale, requested, xp is np)
    if len(_KEYS) > 4096:  # (scale factors that change every call: start afresh)
        _KEYS.clear()
    return _KEYS.setdefault(key, key)


_KEYS: dict = {}  # the fusion keys made so far: a handful of kinds in a training job


def zeros_entry(fields: dict) -> FusionEntry:
    """Return the all-reduce of zeros a joined rank runs in place of one it never made.

    GPU data that no CuPy array can hold (bfloat16, or CuPy missing) travels as a framework's
    tensors on the other ranks (tensor_plans.py): its zeros are a tensor of the kind the binding
    lent for it (tensor_kind.use_device_tensors), moved the same way.
    """
    dtype, shape, op = DTYPES_BY_NAME[fields["dtype"]], fields["shape"], ReduceOp[fields["op"]]
    prescale, postscale = fields["prescale_factor"], fields["postscale_factor"]
    requested = fields["algorithm"]
    kind = device_tensors() if fields["device"] != "cpu" and not cupy_holds(dtype) else None
    if kind is not None:
        key = fusion_key(dtype, op, prescale, postscale, requested, ON_DEVICE)
        zeros = kind.zeros(dtype, tuple(shape))
        return TensorEntry(zeros, kind, dtype, ON_DEVICE, False, op, prescale, postscale,
                           requested, key)  # fmt: skip
    xp = device_module(fields["device"])
    return FusionEntry(xp.zeros(shape, dtype=dtype), xp, False, op, prescale, postscale, requested)


def allreduce_fields(
    name, array, op, prescale, postscale, requested, on_host: Optional[bool], collective="allreduce"
) -> dict:
    """Return what the ranks must agree on for an all-reduce (agreement.py).

    A reduce-scatter agrees on the same fields under its own `collective` name, with `on_host`
    None: only an all-reduce names its device, where a joined rank makes its zeros (zeros_entry).
    """
    fields = array_fields(
        collective,
        name,
        array,
        op=getattr(op, "name", None),
        prescale_factor=float(prescale),
        postscale_factor=float(postscale),
        algorithm=requested,
    )
    if on_host is not None:
        fields["device"] = "cpu" if on_host else "cuda"
    return fields


# In a fused batch that the ring moves, host arrays of at least this size are each a piece of
# their own: reduced where they lie if in place, never copied. Runs of smaller ones share a
# piece, in the fusion buffer unless they lie back to back, so that their messages stay large
# enough to fill the link (docs/engine.md has what this saves on ResNet-50's gradients).
ALONE_BYTES = 256 << 10


@dataclasses.dataclass
class Layout:
    """Where a batch's bytes lie while a transport reduces them (see the module text).

    Attributes:
        pieces: the flat arrays the transport reduces, in the batch's order: an array's (or a
            run of adjacent arrays') own memory, or a part of `buffer`.
        lying: per piece, whether it is arrays' own memory (prescaled where it lies).
        buffer: the fusion buffer that holds the pieces that do not lie where they are (empty
            if none).
        copied: the entries copied into `buffer`, one after another from its start.
        offsets: per entry, where its result is: None for the array itself (reduced where it
            lies), else the element where its part of `buffer` starts (no slice is made until
            one is needed: a CuPy slice costs microseconds).
        copy_back: per entry, whether its result is copied back into the entry's array.
        source: for one out-of-place array reduced straight into `buffer`, the input; else None.
        factor_on_copy_back: the result factor is applied as results are copied back (every
            result is), not by the transport.
    """

    pieces: list
    lying: list
    buffer: object
    copied: list
    offsets: list
    copy_back: list
    source: object = None
    factor_on_copy_back: bool = False


def lay_out(entries: list, xp, module, takes_pieces: bool, takes_source: bool = True) -> Layout:
    """Return the layout of `entries` (equal keys) for a transport on arrays of `module`.

    `module` is `xp`, or numpy where GPU arrays are staged through host memory; `takes_pieces`
    says whether the algorithm reduces a `Pieces` (the ring on the host), else one buffer;
    `takes_source` whether it can read its input apart from the result (not Adasum's).
    """
    if len(entries) == 1:
        return _lay_out_one(entries[0], xp, module, takes_source)
    on_device = module is xp
    groups = _piece_groups(entries) if takes_pieces else [entries]
    own = [adjacent_span(group) if on_device else None for group in groups]
    if len(groups) == 1 and own[0] is None:
        buffered = entries  # the common case, a batch of small arrays: all copied in
    else:
        buffered = [e for group, mine in zip(groups, own) if mine is None for e in group]
    # Where each buffered entry starts in the buffer; the last is the buffer's size.
    starts = list(itertools.accumulate((entry.array.size for entry in buffered), initial=0))
    buffer = _buffer(buffered, starts[-1], xp, module)
    pieces, offsets, done = [], [], 0  # (done: buffered entries placed so far)
    for group, mine in zip(groups, own):
        if mine is not None:
            pieces.append(mine)
            offsets += [None] * len(group)
            continue
        end = done + len(group)
        pieces.append(buffer[starts[done] : starts[end]])
        offsets += starts[done:end]
        done = end
    if on_device:  # out-of-place results are views of the buffer, in-place ones copied back
        copy_back = [start is not None and entry.inplace for entry, start in zip(entries, offsets)]
    else:
        copy_back = [start is not None for start in offsets]
    return Layout(
        pieces,
        [mine is not None for mine in own],
        buffer,
        buffered,
        offsets,
        copy_back,
        factor_on_copy_back=not takes_pieces and all(copy_back),
    )


def _lay_out_one(entry: FusionEntry, xp, module, takes_source: bool) -> Layout:
    """The layout of one array: where it lies, straight from it into a new result, or copied."""
    array = entry.array
    on_device = module is xp
    if on_device:
        # (numpy may mark an array read-only; CuPy's arrays are always writeable)
        if entry.inplace and array.flags.c_contiguous and getattr(array.flags, "writeable", True):
            return Layout([array.reshape(-1)], [True], None, [], [None], [False])
        if takes_source and not entry.inplace and entry.prescale == 1.0:
            if array.flags.c_contiguous:
                result = new_array(module, array.size, array.dtype)
                return Layout([result], [False], result, [], [0], [False], array.reshape(-1))
    buffer = _buffer([entry], array.size, xp, module)
    back = entry.inplace or not on_device
    return Layout([buffer], [False], buffer, [entry], [0], [back], None, back)


def _buffer(buffered: list, total: int, xp, module):
    """Return the fusion buffer for the `buffered` entries, `total` elements of `module`."""
    dtype = buffered[0].array.dtype if buffered else np.dtype(np.uint8)
    if module is not xp:
        return host_scratch(xp, dtype, total)  # staged results are copied back to the GPU
    if any(not entry.inplace for entry in buffered):
        return new_array(module, total, dtype)  # out-of-place results are views of it
    return scratch(module, dtype, total, "fusion")


def fused_allreduce(comm, entries: list, timeline=None) -> list:
    """All-reduce `entries` (equal keys) as one batch; return their results in order.

    `timeline`, if given, is called as `timeline(phase)` and returns a context manager that
    records the phase (the engine passes its Chrome-trace recorder).
    """
    span = timeline or (lambda phase: nullcontext())
    first = entries[0]
    if type(first) is TensorEntry or any(type(entry) is TensorEntry for entry in entries):
        return _tensor_batch(comm, entries, span)
    dtype, xp, op = first.array.dtype, first.xp, first.op
    # What moves the batch (transport.py): MPI by default; an Adasum stays on MPI.
    transport = select(current().settings, xp, op, dtype)
    module = np if staged(xp, transport) else xp
    nbytes = sum(entry.array.nbytes for entry in entries)
    # MPI names its algorithm (ring, mpi, ...), the other transports themselves (gloo, nccl):
    # the timeline's ALLREDUCE_<name> says what moved the buffer.
    chosen = (
        "adasum"
        if op == ReduceOp.ADASUM
        else transport.allreduce_algorithm(first.requested, nbytes, dtype, module, comm)
    )
    factor = result_factor(op, first.postscale, comm.size)
    if module is not xp and op != ReduceOp.ADASUM and in_pieces(nbytes):
        return _staged_in_pieces(comm, entries, transport, chosen, factor, span)
    # The ring takes a batch as `Pieces`, each reduced where it lies; one array needs no pieces.
    takes_pieces = chosen == "ring" and module is np and comm.size > 1 and len(entries) > 1
    layout = lay_out(entries, xp, module, takes_pieces, takes_source=op != ReduceOp.ADASUM)
    if layout.copied:
        with span("MEMCPY_IN_FUSION_BUFFER"):
            copy_in(layout.buffer, [entry.array for entry in layout.copied], xp, first.prescale)
    for piece, lying in zip(layout.pieces, layout.lying):
        if lying:
            scale(module, piece, first.prescale)  # (copies in took it on the way)
    if transport.host_reads:
        synchronize_device(module)  # the GPU must be done with the data before MPI reads it
    finish = None
    if factor != 1.0 and not layout.factor_on_copy_back:
        finish = lambda part: scale(module, part, factor)  # noqa: E731
    buf = Pieces(layout.pieces) if takes_pieces else layout.pieces[0]
    with span(f"ALLREDUCE_{chosen.upper()}"):
        if op == ReduceOp.ADASUM:
            # Adasum's dot products are per tensor, as Horovod's: the buffer travels fused,
            # and each entry's part is combined by its own angle.
            algorithms.adasum_allreduce(comm, buf, xp=module, parts=_bounds(entries))
            if finish is not None:
                finish(buf)
        else:
            transport.allreduce(comm, buf, combined_as(op), module, chosen, finish, layout.source)
    return hand_back(entries, layout, module, factor if layout.factor_on_copy_back else 1.0, span)


def _staged_in_pieces(comm, entries: list, transport, chosen: str, factor: float, span) -> list:
    """All-reduce a large batch of GPU arrays that `transport` moves through host memory: one
    array where it lies (else the batch joined on the GPU), through the host in pieces whose
    copies overlap the transfer (staging.through_host_in_pieces), the scaling on the host; then
    the results handed back from the GPU buffer as a batch on a GPU transport is."""
    first, xp = entries[0], entries[0].xp
    op, prescale = combined_as(first.op), first.prescale
    finish = None if factor == 1.0 else (lambda part: scale(np, part, factor))  # noqa: E731
    one = first.array if len(entries) == 1 and first.array.flags.c_contiguous else None
    if one is not None:
        source = one.reshape(-1)
        target = source if first.inplace else new_array(xp, source.size, source.dtype)
    else:
        total = sum(entry.array.size for entry in entries)
        source = target = new_array(xp, total, first.array.dtype)
        with span("MEMCPY_IN_FUSION_BUFFER"):
            copy_in(source, [entry.array for entry in entries], xp, 1.0)

    def move(part):
        scale(np, part, prescale)
        transport.allreduce(comm, part, op, np, chosen, finish, None)

    with span(f"ALLREDUCE_{chosen.upper()}"):
        through_host_in_pieces(source, target, xp, move)
    if one is not None:
        return [one if first.inplace else target.reshape(one.shape)]
    offsets = list(itertools.accumulate((entry.array.size for entry in entries[:-1]), initial=0))
    layout = Layout([target], [False], target, list(entries), offsets,
                    [entry.inplace for entry in entries])  # fmt: skip
    return hand_back(entries, layout, xp, 1.0, span)


def _tensor_batch(comm, entries: list, span) -> list:
    """All-reduce a batch that holds framework tensors: as they are where every entry is one
    of the same kind that the batch's transport carries, else on the general way through
    their views, as the other ranks may (element for element the same reduction)."""
    first = entries[0]
    kind = getattr(first, "kind", None)
    if kind is None or not all(type(e) is TensorEntry and e.kind is kind for e in entries):
        return _through_views(comm, entries, span)
    op, prescale = first.op, first.prescale
    transport = select(current().settings, first.xp, op, first.dtype)
    if not kind.carried_by(transport):
        return _through_views(comm, entries, span)
    factor = result_factor(op, first.postscale, comm.size)
    moves = comm.size > 1 and any(entry.array.nbytes for entry in entries)
    combined = combined_as(op)
    if len(entries) == 1 and kind.contiguous(first.array):  # reduced where it lies, or
        # straight into its result (one in another layout is joined alone, in its order)
        tensor, inplace = first.array, first.inplace
        out, source = (tensor, None) if inplace else (kind.empty_like(tensor), tensor)
        if prescale != 1.0 and source is not None:
            kind.flat(out)[...] = kind.flat(source)
            source = None
        if prescale != 1.0:
            kind.scale(out, prescale)
        with span(f"ALLREDUCE_{transport.name.upper()}"):
            return [reduce_tensor(kind, transport, comm, out, source, combined, moves, factor)]
    tensors = [entry.array for entry in entries]
    with span("MEMCPY_IN_FUSION_BUFFER"):
        inplace = [entry.inplace for entry in entries]
        buffer, parts = kind.join(tensors, prescale, reused=all(inplace))
    with span(f"ALLREDUCE_{transport.name.upper()}"):
        if moves:
            kind.allreduce(transport, comm, buffer, None, combined)
    with span("MEMCPY_OUT_FUSION_BUFFER"):
        return kind.split(buffer, parts, tensors, inplace, factor)


def reduce_tensor(kind, transport, comm, out, source, op, moves: bool, factor: float):
    """Reduce a framework tensor as it is, and return `out`: `source` (or `out` itself, where
    None) into `out` with `op` (a Sum, Min, Max or Product) where data `moves` (more than one
    rank, not empty), else `source` copied over; then times `factor`. The one transfer of the
    short way (small_allreduce.tensor_allreduce) and of the engine's single tensors."""
    if moves:
        kind.allreduce(transport, comm, out, source, op)
    elif source is not None:  # one rank, or nothing to move: the result is the input
        kind.flat(out)[...] = kind.flat(source)
    if factor != 1.0:
        kind.scale(out, factor)
    return out


def _through_views(comm, entries: list, span) -> list:
    """All-reduce a batch the general way, its framework tensors as numpy or CuPy views."""
    viewed = []
    for entry in entries:
        if type(entry) is TensorEntry:
            array = entry.kind.to_core(entry.array)
            entry = FusionEntry(
                array, array_module(array), entry.inplace, entry.op, entry.prescale,
                entry.postscale, entry.requested, entry.key,
            )  # fmt: skip
        viewed.append(entry)
    results = fused_allreduce(comm, viewed, span)
    return [
        entry.kind.from_core(result, entry.array, entry.inplace)
        if type(entry) is TensorEntry
        else result
        for entry, result in zip(entries, results)
    ]


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


def adjacent_span(entries: list) -> Optional[np.ndarray]:
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
    """Return the (start, stop) offsets of `entries` in their fused buffer."""
    stops = list(itertools.accumulate(entry.array.size for entry in entries))
    return tuple(zip([0, *stops[:-1]], stops))


def fused_by_kind(comm, entries: list) -> list:
    """All-reduce `entries` of any dtypes: one fused batch per kind, results in order."""
    kinds: dict = {}  # fusion key -> positions, in order
    for i, entry in enumerate(entries):
        kinds.setdefault(entry.key, []).append(i)
    results = [None] * len(entries)
    for positions in kinds.values():
        fused = fused_allreduce(comm, [entries[i] for i in positions])
        for i, result in zip(positions, fused):
            results[i] = result
    return results
