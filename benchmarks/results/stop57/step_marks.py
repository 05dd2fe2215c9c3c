"""Where a warm 2-thread asynchronous step goes, rank by rank (stop 57).

    mpiexec -n 2 python benchmarks/results/stop57/step_marks.py [SLEEP]

The step of engine_requests.py's "async, 2 threads" (200 float32 arrays of 256 values): the
microseconds from the step's start at which the engine's methods and the batch's phases first
begin and end, medians of 40 steps, one column per rank. The methods are wrapped to take the
times (an experiment: the wrappers add a little). SLEEP: seconds to sleep after each step (0,
the default: the engines stay warm).
"""

import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", ".."), os.path.join(HERE, "..")]

from engine_requests import Submitters  # noqa: E402
from step_events import StepEvents  # noqa: E402

import horovodlite as hvd  # noqa: E402
import horovodlite.algorithms as algorithms  # noqa: E402
from horovodlite import engine as engine_module  # noqa: E402
from horovodlite import fusion  # noqa: E402
from horovodlite.state import current  # noqa: E402

KEYS = ["submitted", "cycle_start", "offer_start", "offer_end", "neg_start", "neg_end",
        "ready_start", "ready_end", "into_start", "into_end", "batch_start", "lay_out_start",
        "lay_out_end", "copy_in_start", "copy_in_end", "mpi_start", "mpi_end", "hand_back_start",
        "hand_back_end", "batch_end", "first_result", "all_synced"]  # fmt: skip
EVENTS = StepEvents()
mark, wrap = EVENTS.mark, EVENTS.wrap


def main() -> None:
    hvd.init()
    engine = current().engine
    wrap(engine, "_cycle", "cycle_start", "cycle_end")
    wrap(engine, "_negotiate", "neg_start", "neg_end")
    wrap(engine, "_run_batch", "batch_start", "batch_end")
    wrap(engine._cache, "offer", "offer_start", "offer_end")
    wrap(engine._cache, "ready", "ready_start", "ready_end")
    wrap(engine_module, "into_batches", "into_start", "into_end")
    wrap(fusion, "lay_out", "lay_out_start", "lay_out_end")
    wrap(fusion, "copy_in", "copy_in_start", "copy_in_end")
    wrap(fusion, "hand_back", "hand_back_start", "hand_back_end")
    mpi = algorithms.ALLREDUCE["mpi"]

    def timed_mpi(*args, **kwargs):
        mark("mpi_start")
        try:
            return mpi(*args, **kwargs)
        finally:
            mark("mpi_end")

    algorithms.ALLREDUCE["mpi"] = timed_mpi
    pause = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    arrays = [np.ones(256, np.float32) for _ in range(200)]
    names = [f"s.{i}" for i in range(200)]
    submitters = Submitters(hvd)

    def one_step() -> dict:
        EVENTS.clear()
        hvd.barrier()
        start = time.perf_counter()
        handles = submitters.submit(arrays, names)
        mark("submitted")
        hvd.synchronize(handles[0])
        mark("first_result")
        for handle in handles:
            hvd.synchronize(handle)
        mark("all_synced")
        time.sleep(pause)
        # The first time after the step's start: an earlier step's idle cycle may end after it.
        return {key: (at - start) * 1e6 for key, at in EVENTS.first_after(start).items()}

    for _ in range(5):
        one_step()
    rows = [one_step() for _ in range(40)]
    submitters.close()
    medians = {key: np.nanmedian([row.get(key, np.nan) for row in rows]) for key in KEYS}
    every_rank = hvd.allgather_object(medians)
    if hvd.rank() == 0:
        for key in KEYS:
            print(f"{key:16s} " + "  ".join(f"{m[key]:7.0f}" for m in every_rank))


if __name__ == "__main__":
    main()
