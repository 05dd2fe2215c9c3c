"""The all-to-all without splits, in paired rounds (stop 55): horovodlite's call against the
library's own call on the same data, each call after an MPI barrier, the slowest rank's time.

    HOROVODLITE_TRANSPORT=gloo mpiexec -n 2 python alltoall.py OUT.json [--rounds 400]
    mpiexec -n 2 python alltoall.py OUT.json [--rounds 400]

Over Gloo: horovodlite.torch's alltoall of a CPU tensor (the differentiable call, which sends
even splits explicitly), the core's alltoall of a numpy array (no splits), and Gloo's even
all-to-all on the very group horovodlite moves its data on. Over MPI (the default): the core's
alltoall of a numpy array, and mpi4py's Alltoall on it. Prints the medians of horovodlite's
call minus the library's (µs) and writes every round to OUT.json. Runs against any tree on
PYTHONPATH (the calls are the same before and after stop 55).
"""

import json
import os
import sys

import horovodlite.torch as hvd
import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import horovodlite
from horovodlite.ops import ReduceOp
from horovodlite.state import current
from horovodlite.transport import select

# the CPU twin's paired rounds (benchmarks/cpu_twin.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from cpu_twin import paired_rounds  # noqa: E402

SIZES = [1 << 10, 1 << 20]


def contenders(nbytes: int, comm, gloo_group) -> dict:
    """{name: call}: horovodlite's calls first, the library's own last."""
    array = np.ones(nbytes // 4, dtype=np.float32)
    if gloo_group is None:
        out = np.empty_like(array)
        return {"hvd numpy": lambda: horovodlite.alltoall(array),
                "MPI": lambda: comm.Alltoall(array, out)}  # fmt: skip
    tensor = torch.ones(nbytes // 4)
    options = dist.AllToAllOptions()
    return {
        "hvd torch": lambda: hvd.alltoall(tensor),
        "hvd numpy": lambda: horovodlite.alltoall(array),
        "gloo": lambda: gloo_group.alltoall_base(torch.empty_like(tensor), tensor, [], [],
                                                 options).wait(),
    }  # fmt: skip


def main() -> None:
    out_path = sys.argv[1]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 400
    hvd.init()
    comm = MPI.COMM_WORLD
    state = current()
    gloo_group = None
    if state.settings.transport == "gloo":
        hvd.allreduce(torch.ones(4), op=hvd.Sum)  # (horovodlite builds its group on first use)
        transport = select(state.settings, np, ReduceOp.SUM, np.dtype(np.float32))
        gloo_group = transport.group(state.comm).backend
    results = []
    for nbytes in SIZES:
        calls = contenders(nbytes, comm, gloo_group)
        for call in calls.values():  # warm-up
            for _ in range(5):
                comm.Barrier()
                call()
        slowest = paired_rounds(comm, tuple(calls.values()), rounds)
        results.append({"bytes": nbytes, "names": list(calls), "rounds": slowest.tolist()})
        if comm.rank == 0:
            us = np.median(slowest, axis=0) * 1e6
            diffs = np.median(slowest[:, :-1] - slowest[:, -1:], axis=0) * 1e6
            names = list(calls)
            print(f"{nbytes:>8} B: " + "  ".join(f"{n} {u:8.1f}" for n, u in zip(names, us))
                  + "  |  " + "  ".join(f"{n} - {names[-1]} {d:7.1f}"
                                         for n, d in zip(names, diffs)) + " µs",
                  flush=True)  # fmt: skip
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"np": comm.size, "transport": state.settings.transport,
                       "load": os.getloadavg(), "results": results}, f)  # fmt: skip


if __name__ == "__main__":
    main()
