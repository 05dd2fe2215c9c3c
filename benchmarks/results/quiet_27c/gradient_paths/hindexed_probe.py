"""Probe (issue #27): moving ResNet-50's 161 gradients with an MPI hindexed datatype of their
addresses, against one contiguous buffer. Each rank sends and receives all 97.5 MiB.

    mpiexec -n 2 python benchmarks/results/quiet_27c/gradient_paths/hindexed_probe.py
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))
from engine_fusion import RESNET50_SHAPES  # noqa: E402

comm = MPI.COMM_WORLD
peer = 1 - comm.rank
arrays = [np.full(shape, comm.rank + 1, np.float32) for shape in RESNET50_SHAPES]
total = sum(a.size for a in arrays)
buf, received = np.empty(total, np.float32), np.empty(total, np.float32)
scattered = MPI.UINT32_T.Create_hindexed(
    [a.size for a in arrays], [a.ctypes.data for a in arrays]
).Commit()


def exchange(send, receive):
    MPI.Request.Waitall([comm.Irecv(receive, peer, 1), comm.Isend(send, peer, 1)])


def contiguous():
    exchange([buf, MPI.UINT32_T], [received, MPI.UINT32_T])


def pack_then_send():
    np.concatenate([a.reshape(-1) for a in arrays], out=buf)
    contiguous()


def send_scattered():
    exchange([MPI.BOTTOM, 1, scattered], [received, MPI.UINT32_T])


def receive_then_unpack():
    contiguous()
    offset = 0
    for a in arrays:
        a.reshape(-1)[...] = received[offset : offset + a.size]
        offset += a.size


def receive_scattered():
    exchange([buf, MPI.UINT32_T], [MPI.BOTTOM, 1, scattered])


for name, method in [
    ("contiguous", contiguous),
    ("pack+send", pack_then_send),
    ("hindexed send", send_scattered),
    ("recv+unpack", receive_then_unpack),
    ("hindexed recv", receive_scattered),
]:
    times = []
    for _ in range(7):
        comm.Barrier()
        start = time.perf_counter()
        method()
        times.append(time.perf_counter() - start)
    slowest = comm.allreduce(sorted(times)[3], op=MPI.MAX)
    if comm.rank == 0:
        print(f"{name:16s} {slowest * 1e3:7.2f} ms")
scattered.Free()
