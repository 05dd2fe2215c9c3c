"""The ring's average: dividing after the ring against each rank dividing its own chunk in it.

    mpiexec -n 2 python benchmarks/results/quiet_27d/ring_finish.py

97.5 MiB of float32 (ResNet-50's gradients) summed with algorithms.ring_allreduce, then scaled
by 1/n: the whole buffer after the ring, or `finish` inside it. 11 rounds taking turns; the
medians of the slowest rank's time (ms).
"""

import functools
import time

import numpy as np
from mpi4py import MPI

from horovodlite.algorithms.ring import ring_allreduce
from horovodlite.ops import ReduceOp
from horovodlite.staging import scale

comm = MPI.COMM_WORLD
n = comm.size
x = np.random.default_rng(comm.rank).standard_normal(25_557_032).astype(np.float32)
buf = np.empty_like(x)
segment = 8 << 20
divide = functools.partial(scale, np, factor=1.0 / n)


def after():
    buf[:] = x
    ring_allreduce(comm, buf, ReduceOp.SUM, np, segment)
    divide(buf)


def during():
    buf[:] = x
    ring_allreduce(comm, buf, ReduceOp.SUM, np, segment, divide)


times: dict = {"scale after": [], "scale during": []}
for _ in range(11):
    for name, run in (("scale after", after), ("scale during", during)):
        comm.Barrier()
        start = time.perf_counter()
        run()
        times[name].append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX) * 1e3)
if comm.rank == 0:
    medians = {name: round(float(np.median(t)), 1) for name, t in times.items()}
    print(n, medians, "during / after", round(medians["scale during"] / medians["scale after"], 3))
