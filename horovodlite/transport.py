"""Transports: what moves one flat (fused) buffer between the ranks of a communicator.

Everything above a transport (agreement, the engine, fusion, join, timeouts, process sets) runs
over MPI on every data plane; a transport only moves data that the ranks already agreed on, in
the order they agreed on it. Every transport has the same methods on flat contiguous buffers
(numpy, or CuPy for one that carries GPU buffers; MPI's ring all-reduce also takes a host
`algorithms.pieces.Pieces`, several arrays reduced where they lie):

    allreduce(comm, buf, op, xp, algorithm, finish, source)
                                                    reduce `source` (None: `buf` itself) into
                                                    `buf`, then `finish` it (in place, each
                                                    element once; the ring finishes each chunk
                                                    where it completes)
    reducescatter(comm, buf, bounds, op, xp, algorithm) -> this rank's chunk
    broadcast(comm, buf, root)                      root's `buf` into every rank's
    allgatherv(comm, own, out, counts)              every rank's part into `out`, in rank order
    alltoallv(comm, buf, send_counts, out, recv_counts)
    barrier(comm)

`comm` is the MPI communicator the collective was agreed on; a transport that is not MPI keeps
its own group for each communicator (attached to it, so it lives and dies with it) and builds it
the first time the ranks use it, all at the same point of their agreed order. `op` is never
Average: the fusion code combines an Average as a Sum (ops.combined_as) and divides once, in
`finish`. `host_reads` says whether the host reads GPU buffers (MPI: the GPU must be done with
them first), or a GPU stream does (NCCL: ordered after the work before it, no host wait).

Implementations: `mpi` (today's algorithms; GPU buffers where the MPI library is CUDA-aware),
`cupy-nccl` (CuPy's NCCL binding), both below, and the torch binding's `gloo` and `nccl`
(torch.distributed, registered when horovodlite.torch is imported). Transports that cannot
reduce a dtype or op (Adasum, integers of some widths) leave those buffers to MPI.
"""

import functools

import numpy as np
from mpi4py import MPI

from . import algorithms
from .buffers import array_module, wire_type
from .config import TRANSPORTS
from .ops import ReduceOp, combined_as
from .result_memory import new_array
from .runtime import cuda_aware_mpi

__all__ = [
    "NAMES",
    "ON_DEVICE",
    "MPITransport",
    "available",
    "register",
    "select",
    "describe_choice",
]

# Every name HOROVODLITE_TRANSPORT takes (config.py). "auto": host buffers over MPI; GPU buffers
# over NCCL (torch's, else CuPy's) where it is there, else CUDA-aware MPI, else MPI through host
# memory.
NAMES = TRANSPORTS

# Reductions a transport without user-defined ops can run (Average: as a Sum, ops.combined_as);
# Adasum needs its own algorithm (MPI).
NATIVE_OPS = frozenset({ReduceOp.SUM, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT})

_BY_DEFAULT = frozenset({"auto", "mpi"})

# name -> factory(settings) -> transport or None (None: not usable in this process).
_FACTORIES: dict = {}
# The order in which GPU buffers try transports, unless the setting is "mpi".
_GPU_PREFERENCE = ("nccl", "cupy-nccl")


class MPITransport:
    """Move buffers with mpi4py: horovodlite's algorithms, or the MPI library's own collectives.

    GPU buffers are carried only by a CUDA-aware MPI; otherwise staging.py copies them to host
    memory first.
    """

    name = "mpi"
    host_reads = True

    def __init__(self, segment_bytes: int, hierarchical_allgather):
        self.segment_bytes, self.hierarchical_allgather = segment_bytes, hierarchical_allgather

    @property
    def device(self) -> bool:
        """Whether GPU buffers travel as they are (the MPI library is CUDA-aware)."""
        return cuda_aware_mpi()

    def supports(self, op, dtype) -> bool:
        """Return True: MPI carries every dtype and op (Adasum too)."""
        return True

    def allreduce_algorithm(self, requested, nbytes: int, dtype, xp, comm) -> str:
        """Return the algorithm that will all-reduce `nbytes` of `dtype` (the timeline names it)."""
        return algorithms.choose(requested, algorithms.ALLREDUCE, nbytes, dtype, xp, comm)

    def allreduce(self, comm, buf, op, xp, algorithm: str, finish=None, source=None) -> None:
        run = algorithms.ALLREDUCE[algorithm]
        if source is not None and algorithm != "mpi":
            # MPI_Allreduce writes from a send buffer into the result; our algorithms reduce
            # in place.
            buf[...] = source
            source = None
        if algorithm == "ring":  # finishes each chunk where it completes (algorithms/ring.py)
            run(comm, buf, op, xp, self.segment_bytes, finish)
            return
        if source is None:
            run(comm, buf, op, xp, self.segment_bytes)
        else:
            run(comm, buf, op, xp, self.segment_bytes, source=source)
        if finish is not None:
            finish(buf)

    def reducescatter(self, comm, buf, bounds, op, xp, requested):
        chosen = algorithms.choose(requested, algorithms.REDUCESCATTER, buf.nbytes, buf.dtype, xp)
        return algorithms.REDUCESCATTER[chosen](comm, buf, bounds, op, xp, self.segment_bytes)

    def broadcast(self, comm, buf, root: int) -> None:
        comm.Bcast([buf, wire_type(buf.dtype)], root)

    def allgatherv(self, comm, own, out, counts: list) -> None:
        algorithms.allgatherv(
            comm,
            own,
            out,
            counts,
            wire_type(out.dtype),
            self.segment_bytes,
            self.hierarchical_allgather,
        )

    def alltoallv(self, comm, buf, send_counts: list, out, recv_counts: list) -> None:
        wire = wire_type(buf.dtype)
        comm.Alltoallv(
            [buf, (send_counts, _displacements(send_counts)), wire],
            [out, (recv_counts, _displacements(recv_counts)), wire],
        )

    def barrier(self, comm) -> None:
        comm.Barrier()


class GroupTransport:
    """A transport built on a library's groups (NCCL, Gloo): one group per MPI communicator.

    A subclass gives the library's primitives on flat buffers of one group, each with equal
    parts on every rank; this class derives the uneven collectives from them (an all-gather of
    uneven parts pads them to the largest, a reduce-scatter of uneven chunks all-reduces and
    keeps its own) and moves data that needs no arithmetic as bytes, so every dtype travels.

    Subclasses set `name`, `device` and `reducible` (the dtypes their reductions take), and
    define `make_group(comm)` and the primitives `reduce_all(group, buf, op)`,
    `gather_all(group, send, out)`, `reduce_scatter(group, buf, out, op)`,
    `broadcast_bytes(group, buf, root)`, `alltoallv_bytes(group, buf, send_counts, out,
    recv_counts)` and `barrier_group(group)`.
    """

    name = ""
    device = False
    host_reads = False
    reducible: frozenset = frozenset()

    def __init__(self):
        # The group lives on the communicator as an MPI attribute: freed with it, never
        # confused with a later communicator that reuses its handle.
        self._keyval = MPI.Comm.Create_keyval()

    def group(self, comm):
        """Return this transport's group for `comm`, building it the first time (collective)."""
        group = comm.Get_attr(self._keyval)
        if group is None:
            group = self.make_group(comm)
            comm.Set_attr(self._keyval, group)
        return group

    def supports(self, op, dtype) -> bool:
        """Return whether this transport reduces `dtype` with `op` (None: moves data only)."""
        return op is None or (combined_as(op) in NATIVE_OPS and dtype in self.reducible)

    def allreduce_algorithm(self, requested, nbytes: int, dtype, xp, comm) -> str:
        return self.name

    def allreduce(self, comm, buf, op, xp, algorithm: str, finish=None, source=None) -> None:
        # (shape[0]: `buf` is flat, and may be a framework's tensor, whose size is a method)
        if buf.shape[0] and comm.size > 1:
            if source is None:
                self.reduce_all(self.group(comm), buf, op)
            else:
                self.reduce_into(self.group(comm), source, buf, op)
        elif source is not None:
            buf[...] = source
        if finish is not None:
            finish(buf)

    def reduce_into(self, group, source, buf, op) -> None:
        """Reduce `source` into `buf`; a library with separate send and receive buffers
        overrides this to skip the copy."""
        buf[...] = source
        self.reduce_all(group, buf, op)

    def reducescatter(self, comm, buf, bounds, op, xp, requested):
        lo, hi = bounds[comm.rank]
        if comm.size == 1 or not buf.shape[0]:
            return buf[lo:hi]
        group = self.group(comm)
        if len({stop - start for start, stop in bounds}) == 1:
            out = self.new_like(buf, hi - lo)
            self.reduce_scatter(group, buf, out, op)
            return out
        self.reduce_all(group, buf, op)
        return buf[lo:hi]

    def broadcast(self, comm, buf, root: int) -> None:
        if buf.shape[0] and comm.size > 1:
            self.broadcast_bytes(self.group(comm), self.as_bytes(buf), root)

    def allgatherv(self, comm, own, out, counts: list) -> None:
        starts = _displacements(counts)
        mine = slice(starts[comm.rank], starts[comm.rank] + counts[comm.rank])
        if comm.size == 1 or not out.shape[0]:
            if own is not None:
                out[mine] = own
            return
        if own is None or not _writable(own):
            # In place, this rank's part sits in `out`, which the library rewrites; a read-only
            # array a library would view with a warning (torch).
            part = out[mine] if own is None else own
            own = self.new_like(out, counts[comm.rank])
            own[...] = part
        group, width = self.group(comm), out.dtype.itemsize
        longest = max(counts)
        if longest == min(counts):
            self.gather_all(group, self.as_bytes(own), self.as_bytes(out))
            return
        send = self.new_like(out, longest * width, True)
        gathered = self.new_like(out, longest * width * comm.size, True)
        send[: counts[comm.rank] * width] = self.as_bytes(own)
        self.gather_all(group, send, gathered)
        flat = self.as_bytes(out)
        for rank, (start, count) in enumerate(zip(starts, counts)):
            first = rank * longest * width
            flat[start * width : (start + count) * width] = gathered[first : first + count * width]

    def alltoallv(self, comm, buf, send_counts: list, out, recv_counts: list) -> None:
        if comm.size == 1:
            out[...] = buf
            return
        width = buf.dtype.itemsize
        self.alltoallv_bytes(
            self.group(comm),
            self.as_bytes(buf),
            [c * width for c in send_counts],
            self.as_bytes(out),
            [c * width for c in recv_counts],
        )

    def barrier(self, comm) -> None:
        if comm.size > 1:
            self.barrier_group(self.group(comm))

    # The buffers above are numpy or CuPy arrays, or a framework's own tensors where the
    # subclass moves them as they are (torch's gloo and NCCL; tensor_plans.py). The methods
    # touch them by slicing, assignment, `shape` and `dtype.itemsize`, which all of these share,
    # and by the two below, which such a subclass extends to its tensors.

    def as_bytes(self, buf):
        """View the flat contiguous `buf` as bytes."""
        return buf.view(np.uint8)

    def new_like(self, buf, count: int, as_bytes: bool = False):
        """Return a new flat buffer of `count` elements of `buf`'s dtype (of bytes with
        `as_bytes`), where `buf` lies."""
        return new_array(array_module(buf), count, np.dtype(np.uint8) if as_bytes else buf.dtype)


def _writable(buf) -> bool:
    # (CuPy's arrays and a framework's tensors are always writable)
    return getattr(getattr(buf, "flags", None), "writeable", True)


def _displacements(counts: list) -> list:
    out, total = [], 0
    for count in counts:
        out.append(total)
        total += count
    return out


@functools.cache
def _mpi(segment_bytes: int, hierarchical_allgather) -> MPITransport:
    return MPITransport(segment_bytes, hierarchical_allgather)


def register(name: str, factory) -> None:
    """Make transport `name` available: `factory(settings)` returns it, or None if unusable."""
    if name not in NAMES or name in ("auto", "mpi"):
        raise ValueError(f"transport name must be one of {', '.join(NAMES[2:])}, got {name!r}")
    _FACTORIES[name] = factory
    _forget_choices()


def available(name: str, settings) -> bool:
    """Return whether transport `name` can run in this process."""
    if name in ("auto", "mpi"):
        return True
    factory = _FACTORIES.get(name)
    return factory is not None and factory(settings) is not None


def select(settings, xp, op=None, dtype=None):
    """Return the transport for buffers of module `xp` (and `op`, `dtype` for reductions).

    The transport that HOROVODLITE_TRANSPORT names moves the buffers it can carry (gloo: host
    buffers; nccl, cupy-nccl: GPU buffers) with the ops and dtypes it supports; everything else
    takes the automatic choice. Nothing here communicates, so every rank chooses alike from the
    agreed fields.

    Raises:
        ValueError: the named transport is not available in this process (its library is missing,
            or, for gloo and nccl, horovodlite.torch was not imported).
    """
    owner, registry, choices = _choices
    if owner is not settings or registry is not _FACTORIES:
        choices = _forget_choices(settings)
    key = (xp, op, dtype)
    chosen = choices.get(key)
    if chosen is None:
        chosen = choices[key] = _choose(settings, xp, op, dtype)
    return chosen


# (the Settings, the registry, {(xp, op, dtype): transport}): select() runs on every collective,
# and its choice follows from these alone (the factories keep what they build).
_choices: tuple = (None, None, {})


def _forget_choices(settings=None) -> dict:
    global _choices
    _choices = (settings, _FACTORIES, {})
    return _choices[2]


def _choose(settings, xp, op, dtype):
    mpi = _mpi(settings.ring_segment_bytes, settings.hierarchical_allgather)
    named = settings.transport
    on_device = xp is not np
    if named == "auto" and not on_device:  # the default for host data: first, it is the most used
        return mpi
    if named not in _BY_DEFAULT:
        chosen = _usable(named, settings)
        if chosen is None:
            raise ValueError(_missing(named))
        if chosen.device == on_device and chosen.supports(op, dtype):
            return chosen
    if on_device and named != "mpi":
        for name in _GPU_PREFERENCE:
            chosen = _usable(name, settings)
            if chosen is not None and chosen.supports(op, dtype):
                return chosen
    return mpi


def _usable(name: str, settings):
    factory = _FACTORIES.get(name)
    return factory(settings) if factory is not None else None


def _missing(name: str) -> str:
    needs = {
        "gloo": "torch with gloo, and `import horovodlite.torch` before the first collective",
        "nccl": "torch built with CUDA and NCCL, a GPU, and `import horovodlite.torch`",
        "cupy-nccl": "CuPy with NCCL and a GPU (pip install 'horovodlite[cuda]')",
    }[name]
    return f"HOROVODLITE_TRANSPORT={name} is not available here: it needs {needs}"


def describe_choice(settings) -> dict:
    """Return which transport moves host and GPU buffers, and which are available here."""
    return {
        "setting": settings.transport,
        "host": _choice(settings, np),
        "gpu": _choice(settings, ON_DEVICE),
        "available": [name for name in NAMES[1:] if available(name, settings)],
    }


ON_DEVICE = object()  # stands for a GPU array module in select(): anything but numpy


def _choice(settings, xp) -> str:
    try:
        chosen = select(settings, xp)
    except ValueError as exc:
        return f"none ({exc})"
    if chosen.name == "mpi" and xp is not np:
        return "mpi (CUDA-aware)" if chosen.device else "mpi, staged through host memory"
    return chosen.name


class CupyNcclTransport(GroupTransport):
    """GPU buffers over NCCL through CuPy's binding (cupy.cuda.nccl), on CuPy's current stream.

    NCCL has no timeout: a rank that leaves during a collective leaves the others waiting, as
    with torch's NCCL without its watchdog. A rank that leaves before the collective is caught by
    the agreement over MPI, as on every transport.
    """

    name = "cupy-nccl"
    device = True

    def __init__(self, cupy):
        super().__init__()
        self.cupy, self.nccl = cupy, cupy.cuda.nccl
        nccl = self.nccl
        types = {
            np.int8: "NCCL_INT8",
            np.uint8: "NCCL_UINT8",
            np.int32: "NCCL_INT32",
            np.uint32: "NCCL_UINT32",
            np.int64: "NCCL_INT64",
            np.uint64: "NCCL_UINT64",
            np.float16: "NCCL_FLOAT16",
            np.float32: "NCCL_FLOAT32",
            np.float64: "NCCL_FLOAT64",
        }
        self.types = {np.dtype(t): getattr(nccl, n) for t, n in types.items() if hasattr(nccl, n)}
        self.reducible = frozenset(self.types)
        self.ops = {
            ReduceOp.SUM: nccl.NCCL_SUM,
            ReduceOp.MIN: nccl.NCCL_MIN,
            ReduceOp.MAX: nccl.NCCL_MAX,
            ReduceOp.PRODUCT: nccl.NCCL_PROD,
        }

    def make_group(self, comm):
        unique_id = comm.bcast(self.nccl.get_unique_id() if comm.rank == 0 else None, root=0)
        return self.nccl.NcclCommunicator(comm.size, unique_id, comm.rank)

    def _stream(self) -> int:
        return self.cupy.cuda.get_current_stream().ptr

    def reduce_all(self, group, buf, op) -> None:
        self.reduce_into(group, buf, buf, op)

    def reduce_into(self, group, source, buf, op) -> None:
        kind, stream = self.types[buf.dtype], self._stream()
        group.allReduce(source.data.ptr, buf.data.ptr, buf.size, kind, self.ops[op], stream)

    def reduce_scatter(self, group, buf, out, op) -> None:
        kind = self.types[buf.dtype]
        group.reduceScatter(
            buf.data.ptr, out.data.ptr, out.size, kind, self.ops[op], self._stream()
        )

    def gather_all(self, group, send, out) -> None:
        group.allGather(
            send.data.ptr, out.data.ptr, send.size, self.nccl.NCCL_UINT8, self._stream()
        )

    def broadcast_bytes(self, group, buf, root: int) -> None:
        group.bcast(buf.data.ptr, buf.size, self.nccl.NCCL_UINT8, root, self._stream())

    def alltoallv_bytes(self, group, buf, send_counts, out, recv_counts) -> None:
        # NCCL has no all-to-all: one send and one receive per peer, grouped into one launch.
        stream, kind = self._stream(), self.nccl.NCCL_UINT8
        sends, receives = _displacements(send_counts), _displacements(recv_counts)
        self.nccl.groupStart()
        for peer in range(len(send_counts)):
            if send_counts[peer]:
                group.send(buf.data.ptr + sends[peer], send_counts[peer], kind, peer, stream)
            if recv_counts[peer]:
                group.recv(out.data.ptr + receives[peer], recv_counts[peer], kind, peer, stream)
        self.nccl.groupEnd()

    def barrier_group(self, group) -> None:
        one = self.cupy.zeros(1, dtype=np.float32)
        self.reduce_all(group, one, ReduceOp.SUM)
        self.cupy.cuda.get_current_stream().synchronize()


@functools.cache
def _cupy_nccl(_settings=None):
    try:
        import cupy
        from cupy.cuda import nccl

        usable = nccl.available and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # CuPy missing, or no driver or device
        return None
    return CupyNcclTransport(cupy) if usable else None


_FACTORIES["cupy-nccl"] = lambda settings: _cupy_nccl()
