"""`python -m horovodlite.bench --device cuda`: the collectives on CUDA tensors, as nccl-tests.

Every rank uses GPU `local_rank % device count` (run one process per GPU). For each collective and
size it times, on float32 CUDA tensors:
- horovodlite: `horovodlite.torch` with its automatic transport (NCCL where CuPy lets the tensors
  stay on the GPU; docs/gpu.md), metadata check and all;
- horovodlite-mpi: the same with HOROVODLITE_TRANSPORT=mpi (CUDA-aware MPI, else host staging);
- torch-nccl: torch.distributed's NCCL called directly, the floor (a process group built from
  the MPI world: rank 0's TCPStore address broadcast over MPI).
Each timed block is `iterations` calls back to back, then one device synchronisation; the slowest
rank's time counts, and the median of the blocks is reported with algorithm bandwidth (bytes /
time) and bus bandwidth (algbw times nccl-tests' factor: 2(n-1)/n for all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all, 1 for broadcast). Each size is checked once first.
The rows are the CPU sweep's (sweep.py) plus the transport that moved the data, so that the
command line reports and writes them as it does the CPU's.
"""

import dataclasses
import datetime
import socket

import numpy as np
from mpi4py import MPI

from .method import Timing, message_sizes
from .sweep import result_row

__all__ = ["COLLECTIVES", "CONTENDERS", "cuda_missing", "measure"]

COLLECTIVES = ("allreduce", "broadcast", "allgather", "reducescatter", "alltoall")
CONTENDERS = ("horovodlite", "horovodlite-mpi", "torch-nccl")
_WARMUP_CALLS, _PROBE_CALLS = 2, 3  # untimed calls (groups, buffers), then the timing probe


def cuda_missing() -> str:
    """Return why this process cannot run the GPU benchmark, or "" if it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'horovodlite[torch,cuda]')"
    if not torch.cuda.is_available():
        return (
            f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False): "
            "run it on a machine with NVIDIA GPUs and a CUDA build of torch"
        )
    return ""


def _torch_nccl_group(comm):
    """Return (torch's NCCL process group, its store) over `comm`, or None without NCCL."""
    import torch.distributed as dist

    if not dist.is_nccl_available():
        return None
    one_host = len(set(comm.allgather(MPI.Get_processor_name()))) == 1
    address = store = None
    if comm.rank == 0:
        host = "127.0.0.1" if one_host else socket.getfqdn()
        store = dist.TCPStore(host, 0, comm.size, True, wait_for_workers=False)
        address = (host, store.port)
    host, port = comm.bcast(address, root=0)
    if store is None:
        store = dist.TCPStore(host, port, comm.size, False)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = datetime.timedelta(seconds=300)
    return dist.ProcessGroupNCCL(store, comm.rank, comm.size, options), store


class _Run:
    """One contender's calls for one collective at one size, with the expected result."""

    def __init__(self, torch, collective: str, count: int, n: int, rank: int):
        self.torch, self.n, self.rank = torch, n, rank
        self.part = max(1, count // n)
        count = self.part * n  # every size divides evenly, as in nccl-tests
        base = torch.arange(count, device="cuda", dtype=torch.float32) % 13
        self.x = (base[: self.part] if collective == "allgather" else base) + rank
        whole = [base + r for r in range(n)]
        self.expected = {
            "allreduce": lambda: sum(whole),
            "broadcast": lambda: whole[0],
            "allgather": lambda: torch.cat([w[: self.part] for w in whole]),
            "reducescatter": lambda: sum(whole)[rank * self.part : (rank + 1) * self.part],
            "alltoall": lambda: torch.cat(
                [w[rank * self.part : (rank + 1) * self.part] for w in whole]
            ),  # fmt: skip
        }[collective]()


def _horovodlite_call(hvd, collective: str, run: _Run):
    x = run.x
    return {
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Sum, name="bench"),
        "broadcast": lambda: hvd.broadcast(x, root_rank=0, name="bench"),
        "allgather": lambda: hvd.allgather(x, name="bench"),
        "reducescatter": lambda: hvd.reducescatter(x, op=hvd.Sum, name="bench"),
        "alltoall": lambda: hvd.alltoall(x, name="bench"),
    }[collective]


def _torch_call(group, torch, collective: str, run: _Run):
    import torch.distributed as dist

    x, n, part = run.x, run.n, run.part
    out = torch.empty_like(run.expected)

    def allreduce():
        y = x.clone()
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM
        group.allreduce([y], options).wait()
        return y

    def broadcast():
        y = x.clone()
        options = dist.BroadcastOptions()
        options.rootRank = 0
        group.broadcast([y], options).wait()
        return y

    def allgather():
        group._allgather_base(out, x).wait()
        return out

    def reducescatter():
        options = dist.ReduceScatterOptions()
        options.reduceOp = dist.ReduceOp.SUM
        group._reduce_scatter_base(out, x, options).wait()
        return out

    def alltoall():
        group.alltoall_base(out, x, [part] * n, [part] * n, dist.AllToAllOptions()).wait()
        return out

    return locals()[collective]


def _time(comm, torch, call, iterations: int) -> float:
    comm.Barrier()
    torch.cuda.synchronize()
    start = MPI.Wtime()
    for _ in range(iterations):
        call()
    torch.cuda.synchronize()
    return comm.allreduce((MPI.Wtime() - start) / iterations, op=MPI.MAX)


def _measure(comm, torch, call, schedule) -> Timing:
    _time(comm, torch, call, _WARMUP_CALLS)
    probe = _time(comm, torch, call, _PROBE_CALLS)
    iterations = int(schedule.seconds / max(probe, 1e-9))
    iterations = max(schedule.min_iterations, min(schedule.max_iterations, iterations))
    samples = tuple(_time(comm, torch, call, iterations) for _ in range(schedule.repeats))
    return Timing(iterations, _WARMUP_CALLS + _PROBE_CALLS, samples)


def measure(comm, args, schedule) -> tuple:
    """Measure on CUDA tensors on every rank of `comm`; return (rows, facts of the GPUs).

    horovodlite must be initialized; every rank returns the same rows.
    """
    import torch

    import horovodlite.torch as hvd
    from horovodlite import transport
    from horovodlite.state import current

    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    state = current()
    settings = {name: state.settings for name in CONTENDERS}
    settings["horovodlite-mpi"] = dataclasses.replace(state.settings, transport="mpi")
    nccl = _torch_nccl_group(comm)
    n = comm.size
    rows = []
    for collective in args.collectives:
        for nbytes in message_sizes(max(args.min_size, 4 * n), args.max_size, args.size_factor):
            run = _Run(torch, collective, nbytes // 4, n, comm.rank)
            for name in CONTENDERS:
                if name == "torch-nccl":
                    if nccl is None:
                        continue
                    call = _torch_call(nccl[0], torch, collective, run)
                else:
                    state.settings = settings[name]
                    call = _horovodlite_call(hvd, collective, run)
                result = call()
                correct = bool(torch.equal(result.reshape(-1).float(), run.expected))
                correct = comm.allreduce(correct, op=MPI.LAND)
                timing = _measure(comm, torch, call, schedule)
                moved = (transport.select(state.settings, _CuPyLike, hvd.Sum, np.dtype(np.float32))
                         .name if name != "torch-nccl" else "nccl")  # fmt: skip
                # nccl-tests' size, the larger of input and output: run.part * n elements.
                row = result_row(collective, name, run.part * n, n, timing, correct)
                rows.append({**row, "transport": moved})
            state.settings = settings["horovodlite"]
    gpu = {"gpu": torch.cuda.get_device_name(), "gpus_per_host": torch.cuda.device_count()}
    return rows, gpu


class _CuPyLike:
    """Stands for a GPU array module in transport.select() (anything but numpy)."""
