"""Where a warm 2-thread asynchronous step goes, event by event (stop 58).

    mpiexec -n 2 python benchmarks/results/stop58/step_threads.py [THREADS] [BETWEEN]

engine_requests.py's "async, 2 threads" step (200 float32 arrays of 256 values, submitted by
long-lived threads that take turns through two barriers, then synchronized by the main thread).
BETWEEN says what comes before each step: "sync" (the default), 200 synchronous all-reduces, as
a training step's synchronous calls or the benchmark's "one sync each"; "none", a barrier and an
allgather_object only, as engine_requests.py's timing between its contenders. Prints, for 10
steps on rank 0, the microseconds from the step's start at which each submitting thread began and
ended, the engine woke from its sleep, the main thread resumed ("submitted"), the engine's cycles
began and ended, and the results were all in hand.
The engine's methods are wrapped to take the times (an experiment: the wrappers add a little).
"""

import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from step_events import StepEvents  # noqa: E402

import horovodlite as hvd  # noqa: E402
from horovodlite.state import current  # noqa: E402

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
BETWEEN = sys.argv[2] if len(sys.argv) > 2 else "sync"
COUNT, VALUES, STEPS, SHOWN = 200, 256, 40, 10
EVENTS = StepEvents()
mark, wrap = EVENTS.mark, EVENTS.wrap


def main() -> None:
    hvd.init()
    engine = current().engine
    wrap(engine._wakeup, "sleep", "sleep", "woke")
    wrap(engine, "_cycle", "cycle", "cycle_end")
    arrays = [np.ones(VALUES, np.float32) for _ in range(COUNT)]
    names = [f"step.{i}" for i in range(COUNT)]
    start, done = threading.Barrier(THREADS + 1), threading.Barrier(THREADS + 1)
    handles = [None] * THREADS

    def submit(t: int) -> None:
        while True:
            start.wait()
            mark(f"t{t}")
            handles[t] = [hvd.allreduce_async(arrays[i], name=names[i])
                          for i in range(t, COUNT, THREADS)]  # fmt: skip
            mark(f"t{t}_end")
            done.wait()

    for t in range(THREADS):
        threading.Thread(target=submit, args=(t,), daemon=True).start()
    rows = []
    for _ in range(STEPS):
        if BETWEEN == "sync":
            for a, n in zip(arrays, names):
                hvd.allreduce(a, name=n)
        else:
            hvd.allgather_object(0.0)
        hvd.barrier()
        EVENTS.clear()
        begin = time.perf_counter()
        start.wait()
        done.wait()
        mark("submitted")
        for theirs in handles:
            for handle in theirs:
                hvd.synchronize(handle)
        mark("results")
        shown = [(at, what) for at, what in sorted(EVENTS.events) if at - begin < 3e-3]
        rows.append(" ".join(f"{what}@{(at - begin) * 1e6:.0f}" for at, what in shown))
    if hvd.rank() == 0:
        print("\n".join(rows[-SHOWN:]))
    hvd.shutdown()


if __name__ == "__main__":
    main()
