"""torch.distributed's Gloo and NCCL as horovodlite transports (horovodlite/transport.py).

Importing horovodlite.torch registers them: `gloo` moves host buffers, `nccl` GPU buffers. Each MPI
communicator of horovodlite (a process set's, the engine's) gets its own torch process group, built
from horovodlite's MPI world the first time the ranks move data on it: its rank 0 starts a TCPStore
on a free port and broadcasts the address over MPI, so there is no second launcher. On one host the
sockets use loopback; across hosts, the address of the interface named by HOROVODLITE_GLOO_IFACE
(Horovod's HOROVOD_GLOO_IFACE, torch's GLOO_SOCKET_IFNAME), else of the host's name, and a name
that resolves to loopback fails at once on every rank (hosts.py). The ranks agree on every
collective over MPI first, exactly as on the MPI transport; the group only moves the agreed
buffers, in the agreed order.

The buffers arrive as numpy or CuPy arrays (tensors.py made them) and are viewed as tensors
without copying. NCCL runs ordered after CuPy's current stream and orders that stream after
itself, so no host waits for the GPU (`TorchTransport._run`). A Gloo operation waits at most
the collective timeout
(HOROVODLITE_COLLECTIVE_TIMEOUT); a peer that dies during one closes its sockets, and the others
fail at once with a HorovodLiteError.
"""

import datetime
import functools
import os

import ml_dtypes
import numpy as np
from mpi4py import MPI

import torch
import torch.distributed as dist
from horovodlite.buffers import SUPPORTED_DTYPES
from horovodlite.exceptions import HorovodLiteError
from horovodlite.hosts import one_host, reachable_address
from horovodlite.transport import NATIVE_OPS, GroupTransport, register

__all__ = ["TorchTransport"]

# torch names the reductions a group transport runs as horovodlite does (Sum, Min, Max, Product;
# Average combines as a Sum: horovodlite.ops.combined_as).
_OPS = {op: getattr(dist.ReduceOp, op.name) for op in NATIVE_OPS}


def _allreduce_options(op) -> dist.AllreduceOptions:
    options = dist.AllreduceOptions()
    options.reduceOp = _OPS[op]
    return options


# Made once per op: torch reads them during the call (its work copies the op), and making one
# costs 0.6 µs, a tenth of a small all-reduce's own Python.
_ALLREDUCE_OPTIONS = {op: _allreduce_options(op) for op in NATIVE_OPS}

# What Gloo and NCCL both reduce: the supported dtypes less those Gloo cannot (16-bit integers,
# unsigned ones wider than 8 bits) and bool, which goes to MPI, whose Sum is a logical or as
# Horovod's. Data movement takes every dtype.
_REDUCIBLE = SUPPORTED_DTYPES - {
    np.dtype(t) for t in (np.int16, np.uint16, np.uint32, np.uint64, np.bool_)
}


class _Group:
    """A torch process group and the store it was built on (rank 0 serves it: keep it alive)."""

    def __init__(self, backend, store, device=None):
        self.backend, self.store, self.device = backend, store, device


class TorchTransport(GroupTransport):
    """Move buffers with a torch.distributed backend: "gloo" (host) or "nccl" (GPU)."""

    reducible = _REDUCIBLE

    def __init__(self, backend: str, timeout: float, interface: str = ""):
        super().__init__()
        self.name, self.device = backend, backend == "nccl"
        self.timeout = datetime.timedelta(seconds=timeout)
        self.interface = interface

    def make_group(self, comm) -> _Group:
        address, local = _address(comm, self.interface, self.name)
        store = _store(comm, address, self.timeout)
        if self.device:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self.timeout
            device = torch.device("cuda", torch.cuda.current_device())
            return _Group(
                dist.ProcessGroupNCCL(store, comm.rank, comm.size, options), store, device
            )
        options = dist.ProcessGroupGloo._Options()
        options._timeout = self.timeout
        # Gloo's sockets: on the interface named, else on the address found for this rank.
        if self.interface and not local:
            device = dist.ProcessGroupGloo.create_device(interface=self.interface)
        else:
            device = dist.ProcessGroupGloo.create_device(hostname=address)
        options._devices = [device]
        return _Group(dist.ProcessGroupGloo(store, comm.rank, comm.size, options), store)

    def _run(self, group: _Group, start, host_waits: bool = False, tensors: bool = False) -> None:
        """Run the torch collective `start()` (it returns a Work) and wait for it.

        Gloo: the host waits. NCCL: nothing waits on the host. NCCL's stream starts after the
        work queued on torch's current stream, and `wait()` makes that stream wait for NCCL's,
        as Horovod's and DDP's NCCL streams are ordered by CUDA events: whatever reads the
        result next on it sees it. For CuPy buffers (`tensors` False) torch's current stream is
        CuPy's for the call, the stream that queued the copies into the fusion buffer and reads
        the result (or that DLPack orders after it); torch's own tensors (`tensors`) stay on the
        caller's stream. `host_waits` is for the barrier, whose meaning is the host's.
        """
        try:
            if group.device is None or tensors:
                start().wait()
                return
            with torch.cuda.stream(_cupy_stream(group.device)):
                start().wait()
                if host_waits:
                    torch.cuda.current_stream(group.device).synchronize()
        except RuntimeError as exc:
            raise self._failure(exc) from exc

    def allreduce_tensor(self, comm, out: torch.Tensor, source, op) -> None:
        """Reduce `source` (copied into `out` first), or `out` itself where `source` is None,
        into `out` over `comm` (more ranks than one, `out` not empty): the short way's transfer
        (small_allreduce.tensor_allreduce), torch's call on the caller's stream as in `_run`,
        without the general all-reduce's layers, each of which cost several times its own time
        beside Gloo on a 2-core host (docs/benchmarks.md)."""
        group = self.group(comm)
        if source is not None:
            out.copy_(source)
        try:
            group.backend.allreduce([out], _ALLREDUCE_OPTIONS[op]).wait()
        except RuntimeError as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: RuntimeError) -> HorovodLiteError:
        return HorovodLiteError(
            f"the {self.name} transport failed: {str(exc).splitlines()[0]} (a rank left or "
            f"waited past HOROVODLITE_COLLECTIVE_TIMEOUT={self.timeout.total_seconds():g} s)"
        )

    @staticmethod
    def _tensor(buf) -> torch.Tensor:
        """View `buf` as a tensor: a numpy array, or a CuPy one (inside `_run`, on its stream);
        a tensor is itself (small_allreduce.tensor_allreduce hands torch's on as they are)."""
        if isinstance(buf, torch.Tensor):
            return buf
        if isinstance(buf, np.ndarray):
            if buf.dtype == ml_dtypes.bfloat16:
                return torch.from_numpy(buf.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(buf)
        return torch.from_dlpack(buf)

    def reduce_all(self, group, buf, op) -> None:
        options = _ALLREDUCE_OPTIONS[op]
        tensors = isinstance(buf, torch.Tensor)
        self._run(group, lambda: group.backend.allreduce([self._tensor(buf)], options),
                  tensors=tensors)  # fmt: skip

    def reduce_scatter(self, group, buf, out, op) -> None:
        options = dist.ReduceScatterOptions()
        options.reduceOp = _OPS[op]

        # (torch's flat forms, which its reduce_scatter_tensor and all_gather_into_tensor call:
        # the list forms stage through a flat buffer of their own and copy it, on Gloo and NCCL)
        def start():
            return group.backend._reduce_scatter_base(self._tensor(out), self._tensor(buf), options)

        self._run(group, start, tensors=isinstance(buf, torch.Tensor))

    def gather_all(self, group, send, out) -> None:
        def start():
            return group.backend._allgather_base(self._tensor(out), self._tensor(send))

        self._run(group, start, tensors=isinstance(send, torch.Tensor))

    def broadcast_bytes(self, group, buf, root: int) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = root
        self._run(group, lambda: group.backend.broadcast([self._tensor(buf)], options),
                  tensors=isinstance(buf, torch.Tensor))  # fmt: skip

    def alltoallv_bytes(self, group, buf, send_counts, out, recv_counts) -> None:
        self._run(
            group,
            lambda: group.backend.alltoall_base(
                self._tensor(out),
                self._tensor(buf),
                list(recv_counts),
                list(send_counts),
                dist.AllToAllOptions(),
            ),
            tensors=isinstance(buf, torch.Tensor),
        )

    # torch's own tensors travel as they are (horovodlite/tensor_plans.py): GroupTransport's
    # collectives view and make them through these.

    def as_bytes(self, buf):
        if isinstance(buf, torch.Tensor):
            if buf.shape[0] <= 1:  # (its stride may be anything; torch views bytes at stride 1)
                buf = buf.as_strided(buf.shape, (1,))
            return buf.view(torch.uint8)
        return super().as_bytes(buf)

    def new_like(self, buf, count: int, as_bytes: bool = False):
        if isinstance(buf, torch.Tensor):
            dtype = torch.uint8 if as_bytes else buf.dtype
            return torch.empty(count, dtype=dtype, device=buf.device)
        return super().new_like(buf, count, as_bytes)

    def barrier_group(self, group) -> None:
        self._run(group, lambda: group.backend.barrier(dist.BarrierOptions()), host_waits=True)


def _cupy_stream(device: torch.device):
    """Return CuPy's current stream as a torch stream (the null stream is both libraries')."""
    import cupy  # CUDA buffers arrive as CuPy arrays (tensors.py)

    pointer = cupy.cuda.get_current_stream().ptr
    if pointer == 0:
        return torch.cuda.default_stream(device)
    return torch.cuda.ExternalStream(pointer, device=device)


def _address(comm, interface: str, backend: str) -> tuple:
    """Return (this rank's address for `backend`'s sockets, whether `comm` is on one host).

    Collective on `comm`. On one host, loopback: it needs no name lookup. Across hosts, the
    address of `interface`, else of the host's name (hosts.py); where some rank has none that
    other hosts can reach, every rank raises HorovodLiteError naming the hosts at once, instead
    of waiting for connections that never come until the collective timeout.
    """
    if one_host(comm):
        return "127.0.0.1", True
    address, problem = reachable_address(interface)
    problems = {
        f"host {host!r}: {text}"
        for host, text in comm.allgather((MPI.Get_processor_name(), problem))
        if text
    }
    if problems:
        raise HorovodLiteError(
            f"the {backend} transport spans several hosts but cannot tell them where to "
            f"connect: {'; '.join(sorted(problems))}. Set HOROVODLITE_GLOO_IFACE (or "
            "HOROVOD_GLOO_IFACE, or GLOO_SOCKET_IFNAME) to the network interface that connects "
            "the hosts, such as eth0, or make the host names resolve to their network addresses"
        )
    return address, False


def _store(comm, address: str, timeout: datetime.timedelta):
    """Return a TCPStore for `comm`: its rank 0 serves it on a free port, told to all over MPI."""
    port = server = None
    if comm.rank == 0:
        server = dist.TCPStore(address, 0, comm.size, True, timeout=timeout, wait_for_workers=False)
        port = server.port
    address, port = comm.bcast((address, port), root=0)
    if server is not None:
        return server
    return dist.TCPStore(address, port, comm.size, False, timeout=timeout)


@functools.cache
def _transport(backend: str, timeout: float, interface: str):
    """Return the transport for `backend`, or None where this torch cannot run it."""
    if backend == "gloo" and not dist.is_gloo_available():
        return None
    if backend == "nccl" and not (dist.is_nccl_available() and torch.cuda.is_available()):
        return None
    return TorchTransport(backend, timeout, interface)


def _interface(settings) -> str:
    """The network interface for addresses across hosts: horovodlite's, else torch's, else ""."""
    return settings.gloo_iface or os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]


def _gloo(settings):
    return _transport("gloo", settings.collective_timeout, _interface(settings))


def _nccl(settings):
    return _transport("nccl", settings.collective_timeout, _interface(settings))


register("gloo", _gloo)
register("nccl", _nccl)
