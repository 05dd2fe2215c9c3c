"""The synchronous collectives on numpy and GPU arrays.

Each collective is written once, as a private function with an `inplace` parameter; the public
names are one-line wrappers. Every call first validates its arguments, then agrees on its
metadata with the other ranks (see agreement.py), then moves data.
"""

import operator

import numpy as np

from . import algorithms
from .agreement import agree
from .algorithms.scratch import chunk_bounds
from .buffers import array_module, as_array, cuda_aware_mpi, synchronize_device, wire_type
from .ops import ReduceOp, resolve_op
from .process_sets import communicator, global_process_set

__all__ = [
    "allreduce",
    "allreduce_",
    "broadcast",
    "broadcast_",
    "allgather",
    "reducescatter",
    "alltoall",
    "barrier",
    "broadcast_object",
    "allgather_object",
]


# ---------------------------------------------------------------------------------------------
# Working buffers: where the algorithm runs, and how its result gets back to the caller.


class _Work:
    """A flat contiguous buffer for an algorithm to run on, and how to hand back its result.

    GPU arrays are used as they are when MPI is CUDA-aware, else staged through host memory.
    """

    def __init__(self, array, xp, *, copy: bool, inplace: bool = False):
        self.array, self.xp, self.inplace = array, xp, inplace
        self.staged = xp is not np and not cuda_aware_mpi()
        if self.staged:
            self.buf, self.module = xp.asnumpy(array).reshape(-1), np
        elif not copy and array.flags.c_contiguous:
            self.buf, self.module = array.reshape(-1), xp
        else:
            self.buf, self.module = xp.array(array, copy=True, order="C").reshape(-1), xp
        self.aliased = not self.staged and _shares_memory(self.buf, array)
        synchronize_device(self.module)

    def result(self, buf=None, shape=None):
        """Return `buf` (default: the working buffer) shaped as `shape`, delivered to the caller."""
        buf = self.buf if buf is None else buf
        shape = self.array.shape if shape is None else shape
        out = buf.reshape(shape)
        if self.staged:
            out = self.xp.asarray(out)
        if not self.inplace:
            return out
        if not self.aliased:
            self.array[...] = out
        return self.array


def _shares_memory(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return np.shares_memory(a, b)
    return a.data.ptr == b.data.ptr


def _scale(xp, buf, factor: float) -> None:
    # Unsafe casting lets integer arrays scale in float64 and truncate toward zero, as Horovod.
    if factor != 1.0:
        xp.multiply(buf, factor, out=buf, casting="unsafe")


# ---------------------------------------------------------------------------------------------
# Argument checks. They run before any communication; a failure is passed to agree(), which
# raises it on this rank and a MismatchError naming this rank on all others.


def _check_reduction(array, op: ReduceOp, prescale: float, postscale: float) -> None:
    if op == ReduceOp.ADASUM:
        raise NotImplementedError("Adasum is not implemented in horovodlite: use Average or Sum")
    if array.dtype == np.bool_:
        if op == ReduceOp.AVERAGE:
            raise TypeError("Average of bool arrays is undefined: use Sum (or) or Min (and)")
        if prescale != 1.0 or postscale != 1.0:
            raise TypeError("bool arrays cannot be scaled: drop prescale/postscale_factor")


def _check_writable(array, what: str) -> None:
    if not getattr(array.flags, "writeable", True):
        raise ValueError(f"{what} writes into its input, but the array is read-only")


def _check_rows(array, what: str) -> None:
    if array.ndim == 0:
        raise ValueError(f"{what} works on dimension 0, but got a 0-d array: reshape it to (1,)")


def _root_index(root_rank, ranks) -> int:
    """Return the position of global rank `root_rank` in the process set `ranks`."""
    try:
        root = operator.index(root_rank)
    except TypeError:
        raise TypeError(f"root_rank must be an int, got {type(root_rank).__name__}") from None
    if root not in ranks:
        raise ValueError(
            f"root_rank {root} is not a rank of this process set (ranks {list(ranks)})"
        )
    return list(ranks).index(root)


def _run_checks(*checks):
    """Run the argument checks in order; return the first error, or None."""
    try:
        for check in checks:
            check()
    except (TypeError, ValueError, NotImplementedError) as exc:
        return exc
    return None


# ---------------------------------------------------------------------------------------------
# All-reduce and reduce-scatter.


def _allreduce(tensor, op, average, name, prescale_factor, postscale_factor, process_set,
               algorithm, inplace):  # fmt: skip
    comm, _ = communicator(process_set)
    array = as_array(tensor)
    xp = array_module(array)
    resolved = {}

    def parse():
        resolved["op"] = resolve_op(op, average)
        _check_reduction(array, resolved["op"], prescale_factor, postscale_factor)
        resolved["requested"] = algorithms.requested_algorithm(algorithm)
        if inplace:
            _check_writable(array, "allreduce_")

    error = _run_checks(parse)
    fields = {
        "collective": "allreduce",
        "name": name,
        "dtype": str(array.dtype),
        "shape": tuple(array.shape),
        "op": getattr(resolved.get("op"), "name", None),
        "prescale_factor": float(prescale_factor),
        "postscale_factor": float(postscale_factor),
        "algorithm": resolved.get("requested"),
    }
    agree(comm, fields, error)
    op = resolved["op"]
    work = _Work(array, xp, copy=not inplace, inplace=inplace)
    buf = work.buf
    chosen = algorithms.choose(
        resolved["requested"], algorithms.ALLREDUCE, buf.nbytes, buf.dtype, work.module
    )
    _scale(work.module, buf, prescale_factor)
    algorithms.ALLREDUCE[chosen](comm, buf, op, work.module)
    divisor = comm.size if op == ReduceOp.AVERAGE else 1
    _scale(work.module, buf, postscale_factor / divisor)
    return work.result()


def allreduce(tensor, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set, algorithm=None, average=None):  # fmt: skip
    """Return the reduction of `tensor` over all ranks of the process set.

    Args:
        tensor: a numpy array, a CuPy array, or any array with the buffer protocol,
            `__cuda_array_interface__` or DLPack. Same shape and dtype on every rank.
        op: Average (default), Sum, Min, Max or Product. Average of integers truncates.
        name: a name for error messages (and, in async use, for matching across ranks).
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result (after Average's division).
        process_set: the ranks taking part; default all.
        algorithm: "ring", "naive", "mpi", or None to choose by message size
            (HOROVODLITE_ALLREDUCE_ALGORITHM sets the default).
        average: deprecated; True means op=Average, False op=Sum.

    Raises:
        TypeError, ValueError: bad arguments on this rank (raised before communication).
        HorovodLiteError: the ranks' arguments disagree, or another rank's were bad.
    """
    return _allreduce(tensor, op, average, name, prescale_factor, postscale_factor, process_set,
                      algorithm, inplace=False)  # fmt: skip


def allreduce_(tensor, op=None, name=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set, algorithm=None, average=None):  # fmt: skip
    """In-place allreduce(): write the result into `tensor` and return it."""
    return _allreduce(tensor, op, average, name, prescale_factor, postscale_factor, process_set,
                      algorithm, inplace=True)  # fmt: skip


def reducescatter(tensor, op=ReduceOp.AVERAGE, name=None, prescale_factor=1.0,
                  postscale_factor=1.0, process_set=global_process_set,
                  algorithm=None):  # fmt: skip
    """Reduce `tensor` over the ranks and return this rank's slice of dimension 0.

    Rows are split as Horovod does: with n rows and k ranks, ranks 0 .. n % k - 1 get
    n // k + 1 rows and the others n // k. `algorithm` is "ring", "mpi" or None.
    """
    comm, _ = communicator(process_set)
    array = as_array(tensor)
    xp = array_module(array)
    resolved = {}

    def parse():
        resolved["op"] = resolve_op(op, None)
        _check_rows(array, "reducescatter")
        _check_reduction(array, resolved["op"], prescale_factor, postscale_factor)
        resolved["requested"] = algorithms.requested_algorithm(algorithm)
        if resolved["requested"] not in (None, *algorithms.REDUCESCATTER):
            raise ValueError(
                f"reducescatter has no {resolved['requested']!r} algorithm: use "
                f"{', '.join(algorithms.REDUCESCATTER)} or None"
            )

    error = _run_checks(parse)
    fields = {
        "collective": "reducescatter",
        "name": name,
        "dtype": str(array.dtype),
        "shape": tuple(array.shape),
        "op": getattr(resolved.get("op"), "name", None),
        "prescale_factor": float(prescale_factor),
        "postscale_factor": float(postscale_factor),
        "algorithm": resolved.get("requested"),
    }
    agree(comm, fields, error)
    op = resolved["op"]
    work = _Work(array, xp, copy=True)
    buf = work.buf
    row = int(np.prod(array.shape[1:], dtype=np.int64))
    rows = chunk_bounds(array.shape[0], comm.size)
    bounds = tuple((lo * row, hi * row) for lo, hi in rows)
    chosen = algorithms.choose(
        resolved["requested"], algorithms.REDUCESCATTER, buf.nbytes, buf.dtype, work.module
    )
    _scale(work.module, buf, prescale_factor)
    mine = algorithms.REDUCESCATTER[chosen](comm, buf, bounds, op, work.module).copy()
    divisor = comm.size if op == ReduceOp.AVERAGE else 1
    _scale(work.module, mine, postscale_factor / divisor)
    lo, hi = rows[comm.rank]
    return work.result(mine, (hi - lo, *array.shape[1:]))


# ---------------------------------------------------------------------------------------------
# Data movement.


def _broadcast(tensor, root_rank, name, process_set, inplace):
    comm, ranks = communicator(process_set)
    array = as_array(tensor)
    xp = array_module(array)
    root = {}

    def parse():
        root["index"] = _root_index(root_rank, ranks)
        if inplace:
            _check_writable(array, "broadcast_")

    error = _run_checks(parse)
    fields = {
        "collective": "broadcast",
        "name": name,
        "dtype": str(array.dtype),
        "shape": tuple(array.shape),
        "root_rank": root_rank,
    }
    agree(comm, fields, error)
    work = _Work(array, xp, copy=not inplace, inplace=inplace)
    comm.Bcast([work.buf, wire_type(work.buf.dtype)], root["index"])
    return work.result()


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Return a copy of `tensor` as held by global rank `root_rank`, on every rank."""
    return _broadcast(tensor, root_rank, name, process_set, inplace=False)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast(): overwrite `tensor` with the root's and return it."""
    return _broadcast(tensor, root_rank, name, process_set, inplace=True)


def _displacements(counts) -> list:
    return np.concatenate(([0], np.cumsum(counts)[:-1])).tolist() if len(counts) else []


def allgather(tensor, name=None, process_set=global_process_set):
    """Return every rank's `tensor` concatenated along dimension 0, in rank order.

    Dimension 0 may differ between ranks; the other dimensions and the dtype must match.
    """
    comm, _ = communicator(process_set)
    array = as_array(tensor)
    xp = array_module(array)
    error = _run_checks(lambda: _check_rows(array, "allgather"))
    fields = {
        "collective": "allgather",
        "name": name,
        "dtype": str(array.dtype),
        "trailing_shape": tuple(array.shape[1:]),
    }
    rows = agree(comm, fields, error, payload=array.shape[0] if array.ndim else 0)
    work = _Work(array, xp, copy=False)
    row = int(np.prod(array.shape[1:], dtype=np.int64))
    counts = (rows * row).tolist()
    out = work.module.empty(int(rows.sum()) * row, dtype=array.dtype)
    wire = wire_type(array.dtype)
    comm.Allgatherv([work.buf, wire], [out, (counts, _displacements(counts)), wire])
    return work.result(out, (int(rows.sum()), *array.shape[1:]))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send rows `splits[i]` of `tensor`'s dimension 0 to rank i; return what arrives, in order.

    Without `splits` dimension 0 is split evenly and must divide by the number of ranks.

    Returns:
        The received array, or `(received, received_splits)` when `splits` was given.
    """
    comm, _ = communicator(process_set)
    array = as_array(tensor)
    xp = array_module(array)
    parsed = {}

    def parse():
        _check_rows(array, "alltoall")
        parsed["splits"] = _parse_splits(splits, array.shape[0], comm.size)

    error = _run_checks(parse)
    fields = {
        "collective": "alltoall",
        "name": name,
        "dtype": str(array.dtype),
        "trailing_shape": tuple(array.shape[1:]),
        "splits_given": splits is not None,
    }
    agree(comm, fields, error)
    send_splits = parsed["splits"]
    received_splits = np.empty(comm.size, dtype=np.int64)
    comm.Alltoall(send_splits, received_splits)
    work = _Work(array, xp, copy=False)
    row = int(np.prod(array.shape[1:], dtype=np.int64))
    send_counts, recv_counts = (send_splits * row).tolist(), (received_splits * row).tolist()
    out = work.module.empty(int(received_splits.sum()) * row, dtype=array.dtype)
    wire = wire_type(array.dtype)
    comm.Alltoallv(
        [work.buf, (send_counts, _displacements(send_counts)), wire],
        [out, (recv_counts, _displacements(recv_counts)), wire],
    )
    received = work.result(out, (int(received_splits.sum()), *array.shape[1:]))
    if splits is None:
        return received
    return received, received_splits.astype(np.int32)


def _parse_splits(splits, rows: int, size: int) -> np.ndarray:
    if splits is None:
        if rows % size:
            raise ValueError(
                f"alltoall without splits divides dimension 0 evenly, but {rows} rows do not "
                f"divide by {size} ranks: pass splits="
            )
        return np.full(size, rows // size, dtype=np.int64)
    values = np.asarray(splits)
    if values.dtype.kind not in "iu" and values.size:
        raise TypeError(f"splits must be integers, got dtype {values.dtype}")
    values = values.astype(np.int64).reshape(-1)
    if values.size != size:
        raise ValueError(f"splits has {values.size} entries, expected one per rank ({size})")
    if (values < 0).any():
        raise ValueError(f"splits must be non-negative, got {values.tolist()}")
    if values.sum() != rows:
        raise ValueError(
            f"splits {values.tolist()} add up to {values.sum()}, but dimension 0 has {rows} rows"
        )
    return values


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank of the process set reaches this call."""
    comm, _ = communicator(process_set)
    agree(comm, {"collective": "barrier"})
    comm.Barrier()


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Return the picklable `obj` of global rank `root_rank`, on every rank."""
    comm, ranks = communicator(process_set)
    root = {}
    error = _run_checks(lambda: root.setdefault("index", _root_index(root_rank, ranks)))
    agree(comm, {"collective": "broadcast_object", "name": name, "root_rank": root_rank}, error)
    return comm.bcast(obj, root=root["index"])


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Return the list of every rank's picklable `obj`, in rank order."""
    comm, _ = communicator(process_set)
    agree(comm, {"collective": "allgather_object", "name": name})
    return comm.allgather(obj)
