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
"""

import dataclasses
import datetime
import socket
import sys

import numpy as np
from mpi4py import MPI

from .method import BUS_FACTORS, format_size, message_sizes

__all__ = ["CONTENDERS", "cuda_missing", "run_here"]

COLLECTIVES = ("allreduce", "broadcast", "allgather", "reducescatter", "alltoall")
CONTENDERS = ("horovodlite", "horovodlite-mpi", "torch-nccl")
_FACTORS = {**BUS_FACTORS, "alltoall": lambda n: (n - 1) / n}


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


def _measure(comm, torch, call, schedule) -> float:
    _time(comm, torch, call, 2)  # warm-up: groups, buffers
    probe = _time(comm, torch, call, 3)
    iterations = int(schedule.seconds / max(probe, 1e-9))
    iterations = max(schedule.min_iterations, min(schedule.max_iterations, iterations))
    samples = sorted(_time(comm, torch, call, iterations) for _ in range(schedule.repeats))
    return samples[len(samples) // 2]


def run_here(args, schedule) -> int:
    """Measure inside the current MPI job on CUDA tensors; rank 0 prints the tables."""
    import torch

    import horovodlite.torch as hvd

    comm = MPI.COMM_WORLD
    reasons = [r for r in comm.allgather(cuda_missing()) if r]
    if reasons:
        if comm.rank == 0:
            print(f"--device cuda: {reasons[0]}", file=sys.stderr)
        return 2
    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    from horovodlite import transport
    from horovodlite.state import current

    state = current()
    settings = {name: state.settings for name in CONTENDERS}
    settings["horovodlite-mpi"] = dataclasses.replace(state.settings, transport="mpi")
    nccl = _torch_nccl_group(comm)
    n, root = comm.size, comm.rank == 0
    rows = []
    for collective in args.collectives or COLLECTIVES:
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
                seconds = _measure(comm, torch, call, schedule)
                # nccl-tests' size: the larger of input and output.
                size = max(run.expected.numel(), run.x.numel()) * 4
                algbw = size / seconds / 1e9
                moved = (transport.select(state.settings, _CuPyLike, hvd.Sum, np.dtype(np.float32))
                         .name if name != "torch-nccl" else "nccl")  # fmt: skip
                rows.append({
                    "collective": collective, "contender": name, "bytes": size,
                    "time_us": seconds * 1e6, "algbw_GBps": algbw,
                    "busbw_GBps": algbw * _FACTORS[collective](n), "correct": correct,
                    "transport": moved,
                })  # fmt: skip
            state.settings = settings["horovodlite"]
    if root:
        _print(rows, n, torch)
        _write(rows, args)
    hvd.shutdown()
    return 0


class _CuPyLike:
    """Stands for a GPU array module in transport.select() (anything but numpy)."""


def _print(rows: list, n: int, torch) -> None:
    device = torch.cuda.get_device_name()
    for collective in dict.fromkeys(row["collective"] for row in rows):
        print(f"\n{collective}, {n} ranks, float32 on {device}: time (µs), algbw and busbw (GB/s)")
        print(f"{'size':>10} {'contender':>16} {'transport':>10} {'time':>10} {'algbw':>8} "
              f"{'busbw':>8} correct")  # fmt: skip
        for row in rows:
            if row["collective"] == collective:
                print(f"{format_size(row['bytes']):>10} {row['contender']:>16} "
                      f"{row['transport']:>10} {row['time_us']:>10.1f} {row['algbw_GBps']:>8.2f} "
                      f"{row['busbw_GBps']:>8.2f} {row['correct']}")  # fmt: skip


def _write(rows: list, args) -> None:
    import json
    import os

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.name}_cuda.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"wrote {path}", flush=True)
