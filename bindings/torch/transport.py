"""torch.distributed's Gloo and NCCL as horovodlite transports (horovodlite/transport.py).

Importing horovodlite.torch registers them: `gloo` moves host buffers, `nccl` GPU buffers. Each
MPI communicator of horovodlite (a process set's, the engine's) gets its own torch process group,
built from horovodlite's MPI world the first time the ranks move data on it: its rank 0 starts a
TCPStore on a free port and broadcasts the address over MPI, so there is no second launcher and
no environment variable to set. The ranks agree on every collective over MPI first, exactly as on
the MPI transport; the group only moves the agreed buffers, in the agreed order.

The buffers arrive as numpy or CuPy arrays (tensors.py made them) and are viewed as tensors
without copying. A Gloo operation waits at most the collective timeout
(HOROVODLITE_COLLECTIVE_TIMEOUT); a peer that dies during one closes its sockets, and the others
fail at once with a HorovodLiteError.
"""

import datetime
import functools
import socket

import ml_dtypes
import numpy as np
from mpi4py import MPI

import torch
import torch.distributed as dist
from horovodlite.exceptions import HorovodLiteError
from horovodlite.ops import ReduceOp
from horovodlite.transport import GroupTransport, register

__all__ = ["TorchTransport"]

_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,  # divided afterwards, as for every algorithm
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}

# What Gloo and NCCL both reduce (Gloo has no 16-bit integers nor unsigned wider than 8 bits;
# bool goes to MPI, whose Sum is a logical or as Horovod's). Data movement takes every dtype.
_REDUCIBLE = frozenset(
    np.dtype(t)
    for t in (
        np.float16,
        ml_dtypes.bfloat16,
        np.float32,
        np.float64,
        np.int8,
        np.uint8,
        np.int32,
        np.int64,
    )
)


class _Group:
    """A torch process group and the store it was built on (rank 0 serves it: keep it alive)."""

    def __init__(self, backend, store, device=None):
        self.backend, self.store, self.device = backend, store, device


class TorchTransport(GroupTransport):
    """Move buffers with a torch.distributed backend: "gloo" (host) or "nccl" (GPU)."""

    reducible = _REDUCIBLE

    def __init__(self, backend: str, timeout: float):
        super().__init__()
        self.name, self.device = backend, backend == "nccl"
        self.timeout = datetime.timedelta(seconds=timeout)

    def make_group(self, comm) -> _Group:
        local = len(set(comm.allgather(MPI.Get_processor_name()))) == 1
        store = _store(comm, local, self.timeout)
        if self.device:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self.timeout
            device = torch.device("cuda", torch.cuda.current_device())
            return _Group(
                dist.ProcessGroupNCCL(store, comm.rank, comm.size, options), store, device
            )
        options = dist.ProcessGroupGloo._Options()
        options._timeout = self.timeout
        # On one host, loopback: it needs no name lookup. Across hosts, the address of this
        # host's name, as torch.distributed's own default.
        options._devices = [
            dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")
            if local
            else dist.ProcessGroupGloo.create_default_device()
        ]
        return _Group(dist.ProcessGroupGloo(store, comm.rank, comm.size, options), store)

    def _wait(self, group: _Group, work) -> None:
        try:
            work.wait()
            if group.device is not None:
                # NCCL ran on its own stream, ordered after torch's current one; the core goes on
                # with CuPy, so the result must be there before it reads it.
                torch.cuda.current_stream(group.device).synchronize()
        except RuntimeError as exc:
            raise HorovodLiteError(
                f"the {self.name} transport failed: {str(exc).splitlines()[0]} (a rank left or "
                f"waited past HOROVODLITE_COLLECTIVE_TIMEOUT={self.timeout.total_seconds():g} s)"
            ) from exc

    def _tensor(self, group: _Group, buf) -> torch.Tensor:
        if isinstance(buf, np.ndarray):
            if buf.dtype == ml_dtypes.bfloat16:
                return torch.from_numpy(buf.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(buf)
        # A CuPy array: finished on CuPy's stream before torch's stream reads it.
        import cupy

        cupy.cuda.get_current_stream().synchronize()
        return torch.from_dlpack(buf)

    def reduce_all(self, group, buf, op) -> None:
        options = dist.AllreduceOptions()
        options.reduceOp = _OPS[op]
        self._wait(group, group.backend.allreduce([self._tensor(group, buf)], options))

    def reduce_scatter(self, group, buf, out, op) -> None:
        whole, mine = self._tensor(group, buf), self._tensor(group, out)
        options = dist.ReduceScatterOptions()
        options.reduceOp = _OPS[op]
        parts = list(whole.chunk(group.backend.size()))
        self._wait(group, group.backend.reduce_scatter([mine], [parts], options))

    def gather_all(self, group, send, out) -> None:
        whole = self._tensor(group, out)
        parts = list(whole.chunk(group.backend.size()))
        self._wait(group, group.backend.allgather([parts], [self._tensor(group, send)]))

    def broadcast_bytes(self, group, buf, root: int) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = root
        self._wait(group, group.backend.broadcast([self._tensor(group, buf)], options))

    def alltoallv_bytes(self, group, buf, send_counts, out, recv_counts) -> None:
        work = group.backend.alltoall_base(
            self._tensor(group, out),
            self._tensor(group, buf),
            list(recv_counts),
            list(send_counts),
            dist.AllToAllOptions(),
        )
        self._wait(group, work)

    def barrier_group(self, group) -> None:
        self._wait(group, group.backend.barrier(dist.BarrierOptions()))


def _store(comm, local: bool, timeout: datetime.timedelta):
    """Return a TCPStore for `comm`: its rank 0 serves it on a free port, told to all over MPI."""
    address = port = server = None
    if comm.rank == 0:
        address = "127.0.0.1" if local else socket.getfqdn()
        server = dist.TCPStore(address, 0, comm.size, True, timeout=timeout, wait_for_workers=False)
        port = server.port
    address, port = comm.bcast((address, port), root=0)
    if server is not None:
        return server
    return dist.TCPStore(address, port, comm.size, False, timeout=timeout)


@functools.cache
def _transport(backend: str, timeout: float):
    """Return the transport for `backend`, or None where this torch cannot run it."""
    if backend == "gloo" and not dist.is_gloo_available():
        return None
    if backend == "nccl" and not (dist.is_nccl_available() and torch.cuda.is_available()):
        return None
    return TorchTransport(backend, timeout)


def _gloo(settings):
    return _transport("gloo", settings.collective_timeout)


def _nccl(settings):
    return _transport("nccl", settings.collective_timeout)


register("gloo", _gloo)
register("nccl", _nccl)
