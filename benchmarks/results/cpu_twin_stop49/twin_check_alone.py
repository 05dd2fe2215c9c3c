"""The metadata check alone against an MPI barrier, at 2 ranks (µs, medians of 2000 calls, each
after a barrier, rank 0's time; three blocks each). Usage: mpiexec -n 2 python
twin_check_alone.py"""

import os
import statistics
import time

os.environ["HOROVODLITE_TRANSPORT"] = "gloo"

import horovodlite.torch as hvd  # noqa: E402
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

from horovodlite.agreement import same_everywhere  # noqa: E402
from horovodlite.state import current  # noqa: E402

hvd.init()
comm = MPI.COMM_WORLD
t = torch.ones(256)
for _ in range(50):
    hvd.allreduce(t, name="w")
state = current()
wait = state.watch.check_waiter(lambda: ("x", 1), range(comm.size))


def timed(fn, n=2000):
    out = []
    for _ in range(n):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6


res = {}
for _ in range(3):
    res.setdefault("check", []).append(timed(lambda: same_everywhere(state.comm, 12345, wait)))
    res.setdefault("barrier", []).append(timed(lambda: comm.Barrier()))
    res.setdefault("allgather small", []).append(timed(lambda: comm.allgather(1)))
if comm.rank == 0:
    for k, v in res.items():
        print(f"{k}: {', '.join(f'{x:.1f}' for x in v)} us")
hvd.shutdown()
