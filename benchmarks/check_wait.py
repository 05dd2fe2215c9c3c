"""The checked small all-reduce's wait, side by side in one job: spin first, or yield at once.

    mpiexec -n 2 python benchmarks/check_wait.py [--blocks 40] [--calls 200]

Times, per message size (1 KiB: the tensor travels inside the check; 64 KiB: a check, then
MPI_Allreduce), blocks of calls of
  * auto:            hvd.allreduce(x, op=Sum), the metadata check on (the check's Iallgather is
                     tested without yielding for waiting._SPIN_SECONDS where each rank
                     of the host has a core, then the Watch waits),
  * auto-yielding:   the same with that spin off (the Watch's wait from the first test: it yields
                     the core between tests), as before issue #27,
  * auto-nocheck:    HOROVODLITE_CHECK_METADATA=0,
  * mpi-native:      mpi4py's Allreduce on a duplicate of COMM_WORLD,
taking turns block by block, so that background load hits all alike. Prints µs per call
(median, 20th percentile and fastest block) and the ratios to MPI as JSON, with the load average.
"""

import argparse
import dataclasses
import json
import os
import time

import numpy as np
from mpi4py import MPI

import horovodlite as hvd


def measure(comm, state, nbytes: int, blocks: int, calls: int) -> dict:
    """Time the four ways for `nbytes` of float32, block by block; return their statistics."""
    checked, unchecked = state.settings, dataclasses.replace(state.settings, check_metadata=False)
    watch = state.watch
    spin = watch._spin
    x = np.ones(nbytes // 4, dtype=np.float32)
    out = np.empty_like(x)

    def auto():
        hvd.allreduce(x, op=hvd.Sum)

    def yielding():
        watch._spin = 0.0
        try:
            hvd.allreduce(x, op=hvd.Sum)
        finally:
            watch._spin = spin

    def nocheck():
        state.settings = unchecked
        try:
            hvd.allreduce(x, op=hvd.Sum)
        finally:
            state.settings = checked

    def native():
        comm.Allreduce([x, MPI.FLOAT], [out, MPI.FLOAT], MPI.SUM)

    cases = {"auto": auto, "auto-yielding": yielding, "auto-nocheck": nocheck,
             "mpi-native": native}  # fmt: skip
    times = {name: [] for name in cases}
    for _ in range(blocks):
        for name, call in cases.items():
            comm.Barrier()
            for _ in range(10):
                call()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            elapsed = (time.perf_counter() - start) / calls * 1e6
            times[name].append(max(comm.allgather(elapsed)))
    stats = {name: {"median_us": float(np.median(t)), "p20_us": float(np.percentile(t, 20)),
                    "min_us": float(min(t))} for name, t in times.items()}  # fmt: skip
    mpi = stats["mpi-native"]
    for s in stats.values():
        s["median_over_mpi"] = s["median_us"] / mpi["median_us"]
        s["p20_over_mpi"] = s["p20_us"] / mpi["p20_us"]
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    # `auto` spins as init() chose: not at all where ranks outnumber cores, and then `auto` and
    # `auto-yielding` are the same code.
    spin = hvd.state.current().watch._spin
    report = {"ranks": comm.size, "auto_spin_us": spin * 1e6,
              "load_average_before": os.getloadavg(), "sizes": {}}  # fmt: skip
    for nbytes in (1024, 64 * 1024):
        stats = measure(comm, hvd.state.current(), nbytes, args.blocks, args.calls)
        report["sizes"][str(nbytes)] = stats
    report["load_average_after"] = os.getloadavg()
    if comm.rank == 0:
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
