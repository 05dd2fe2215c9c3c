"""Blocking grouped all-reduce of 161 torch tensors of 1 KiB at one rank, as they are (gloo) or
as views (MPI): `HOROVODLITE_TRANSPORT=gloo mpiexec -n 1 python grouped_now.py LABEL`.
Medians of 100 calls, ms."""

import sys
import time

import horovodlite.torch as hvd
import numpy as np
import torch

hvd.init()
torch.set_num_threads(1)
ts = [torch.full((256,), 1.0) for _ in range(161)]


def tm(f, n=100):
    f()
    s = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        s.append(time.perf_counter() - t)
    return 1e3 * np.median(s)


in_place = tm(lambda: hvd.grouped_allreduce_(ts, name="g_"))
new = tm(lambda: hvd.grouped_allreduce(ts, name="g"))
print(f"{sys.argv[1]} grouped_allreduce_ {in_place:.3f} ms, grouped_allreduce {new:.3f} ms")
