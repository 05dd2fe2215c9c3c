"""Broadcast, all-gather, all-to-all and reduce-scatter of CPU torch tensors over Gloo: horovodlite
against Gloo's own call, in paired rounds (stop 54).

    HOROVODLITE_TRANSPORT=gloo mpiexec -n 2 python movement.py OUT.json [--rounds 400]

For each collective and size, `--rounds` rounds, each of three calls after an MPI barrier, in
turns (the order alternates): horovodlite.torch's call; the same collective of torch.distributed
on a Gloo group of torch's own (what a user has without horovodlite); and on the very Gloo group
horovodlite moves its data on (torch's call, none of horovodlite's code). Each call's time is the
slowest rank's; the differences within a round cancel what drifts between rounds. Prints the
medians (µs) and writes every round to OUT.json. Runs against any tree on PYTHONPATH: the
torch binding's calls are the same before and after stop 54.
"""

import json
import os
import sys

import horovodlite.torch as hvd
import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from horovodlite.ops import ReduceOp
from horovodlite.state import current
from horovodlite.transport import select

# the CPU twin's paired rounds (benchmarks/cpu_twin.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from cpu_twin import paired_rounds  # noqa: E402

SIZES = [1 << 10, 1 << 20]
# torch 2.13 renames the flat forms (the old names warn); either is the same call.
_gather_into = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_scatter_into = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
COLLECTIVES = ["broadcast_", "allgather", "alltoall", "reducescatter"]


def contenders(name: str, tensor: torch.Tensor, group, size: int) -> tuple:
    """Return (horovodlite's call, torch's call on torch's group, torch's call on `group`).

    torch's calls make their output each call, as horovodlite's result is a new tensor (the
    broadcast is in place in all three), and use torch's flat forms (all_gather_into_tensor,
    reduce_scatter_tensor, all_to_all_single): the fastest a user has.
    """
    n = tensor.shape[0]
    if name == "broadcast_":
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return (lambda: hvd.broadcast_(tensor, 0), lambda: dist.broadcast(tensor, 0),
                lambda: group.broadcast([tensor], options).wait())  # fmt: skip
    if name == "allgather":
        return (lambda: hvd.allgather(tensor),
                lambda: _gather_into(torch.empty(n * size), tensor),
                lambda: group._allgather_base(torch.empty(n * size), tensor).wait())  # fmt: skip
    if name == "alltoall":
        options = dist.AllToAllOptions()
        return (lambda: hvd.alltoall(tensor),
                lambda: dist.all_to_all_single(torch.empty(n), tensor),
                lambda: group.alltoall_base(torch.empty(n), tensor, [], [], options).wait())
    options = dist.ReduceScatterOptions()
    options.reduceOp = dist.ReduceOp.SUM
    return (lambda: hvd.reducescatter(tensor, op=hvd.Sum),
            lambda: _scatter_into(torch.empty(n // size), tensor),
            lambda: group._reduce_scatter_base(torch.empty(n // size), tensor, options).wait())


def main() -> None:
    out_path = sys.argv[1]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 400
    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    port = comm.bcast(29500 + os.getpid() % 1000 if rank == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)  # fmt: skip
    state = current()
    transport = select(state.settings, np, ReduceOp.SUM, np.dtype(np.float32))
    hvd.allreduce(torch.ones(4), op=hvd.Sum)  # (horovodlite builds its group on first use)
    group = transport.group(state.comm).backend
    results = []
    for nbytes in SIZES:
        for name in COLLECTIVES:
            tensor = torch.ones(nbytes // 4)
            calls = contenders(name, tensor, group, size)
            for call in calls:  # warm-up
                for _ in range(5):
                    comm.Barrier()
                    call()
            slowest = paired_rounds(comm, calls, rounds)
            row = {"collective": name, "bytes": nbytes, "rounds": slowest.tolist()}
            results.append(row)
            if rank == 0:
                us = np.median(slowest, axis=0) * 1e6
                diff = np.median(slowest[:, 0:1] - slowest[:, 1:], axis=0) * 1e6
                print(f"{name:>14} {nbytes:>8} B: hvd {us[0]:8.1f}  gloo {us[1]:8.1f}  "
                      f"gloo on hvd's group {us[2]:8.1f}  |  hvd - gloo {diff[0]:7.1f}  "
                      f"hvd - same group {diff[1]:7.1f} µs", flush=True)  # fmt: skip
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"np": size, "load": os.getloadavg(), "results": results}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
