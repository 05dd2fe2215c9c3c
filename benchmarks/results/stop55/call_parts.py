"""Where a CPU-twin all-reduce's time goes (stop 55): hvd.allreduce of a 1 KiB CPU torch tensor
over Gloo, each call after an MPI barrier, timed in parts from inside the call: the Python before
the metadata check, the check (agreement.same_everywhere), the transfer (the torch transport's
allreduce_tensor: Gloo's call), and the Python after it. Medians of 1300 calls, per rank.

    HOROVODLITE_TRANSPORT=gloo mpiexec -n 2 python call_parts.py
"""

import time

import horovodlite.torch as hvd
import numpy as np
import torch
from mpi4py import MPI

from horovodlite import small_allreduce
from horovodlite.ops import ReduceOp
from horovodlite.state import current
from horovodlite.transport import select


def main() -> None:
    hvd.init()
    comm = MPI.COMM_WORLD
    tensor = torch.ones(256)
    hvd.allreduce(tensor, op=hvd.Sum)  # (the group, the templates)
    transport = select(current().settings, np, ReduceOp.SUM, np.dtype(np.float32))
    marks = {}

    def timed(name, call):
        def wrapper(*args, **kwargs):
            marks[name + "0"] = time.perf_counter()
            result = call(*args, **kwargs)
            marks[name + "1"] = time.perf_counter()
            return result

        return wrapper

    small_allreduce.same_everywhere = timed("check", small_allreduce.same_everywhere)
    kind = type(transport)
    kind.allreduce_tensor = timed("move", kind.allreduce_tensor)
    rows = []
    for _ in range(1500):
        comm.Barrier()
        start = time.perf_counter()
        hvd.allreduce(tensor, op=hvd.Sum)
        end = time.perf_counter()
        check, move = marks["check1"] - marks["check0"], marks["move1"] - marks["move0"]
        rows.append([marks["check0"] - start, check, move, end - marks["move1"], end - start])
    us = np.median(np.array(rows[200:]), axis=0) * 1e6
    print(f"CALLPARTS rank {comm.rank}: before the check {us[0]:.1f}, check {us[1]:.1f}, "
          f"transfer {us[2]:.1f}, after {us[3]:.1f}, whole call {us[4]:.1f} µs",
          flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
