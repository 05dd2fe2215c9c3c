"""What a sleeping engine's tests for notes cost the rank's other thread (stop 57).

    mpiexec -n 2 python benchmarks/results/stop57/poll_cost.py

Right after an asynchronous all-reduce (its engine then falls asleep), rank 0's main thread
times 200 synchronous 1 KiB all-reduces, or 200 64x64 float32 matmuls, in turns: with every
sleep's tests for notes starting at 100 µs (as before stop 57: `Wakeup.noted` held True), and
as this code does (an engine that its own work woke tests every 2 ms from the start). Medians
of 60 rounds each, ms.
"""

import time

import numpy as np

import horovodlite as hvd
from horovodlite.wakeup import Wakeup

hvd.init()
a = np.ones(256, np.float32)
x = np.ones((64, 64), np.float32)


def syncs():
    for i in range(200):
        hvd.allreduce(a, name=f"poll.{i}")


def matmuls():
    for _ in range(200):
        x @ x


def round_of(work, short: bool) -> float:
    Wakeup.noted = property(lambda self: True, lambda self, value: None) if short else None
    hvd.synchronize(hvd.allreduce_async(a, name="wake"))  # the engines wake, then fall asleep
    hvd.barrier()
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


if __name__ == "__main__":
    for work in (syncs, matmuls):
        times = {True: [], False: []}
        for i in range(120):
            short = i % 2 == 0
            times[short].append(round_of(work, short))
        if hvd.rank() == 0:
            print(f"{work.__name__}: tests from 100 us {np.median(times[True]) * 1e3:.3f} ms, "
                  f"adaptive {np.median(times[False]) * 1e3:.3f} ms")
