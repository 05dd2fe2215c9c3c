"""What engine_requests.py's two submitting threads cost by themselves (stop 57).

    python benchmarks/results/stop57/handoffs.py   # one process; two at once load both cores

Its `Submitters` harness, with a stand-in for allreduce_async that spins 2.2 µs (about what a
repeated request costs to submit) and touches no library: 200 calls from two threads (the
harness's barrier hand-offs) against 200 from one; medians of 300 steps, µs.
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from engine_requests import Submitters  # noqa: E402


class StandIn:
    def allreduce_async(self, array, name=None):
        start = time.perf_counter()
        while time.perf_counter() - start < 2.2e-6:
            pass
        return array


def main() -> None:
    stand_in = StandIn()
    submitters = Submitters(stand_in)
    arrays = [np.ones(256, np.float32) for _ in range(200)]
    names = [f"s.{i}" for i in range(200)]
    two, one = [], []
    for _ in range(300):
        start = time.perf_counter()
        submitters.submit(arrays, names)
        two.append(time.perf_counter() - start)
        start = time.perf_counter()
        for array, name in zip(arrays, names):
            stand_in.allreduce_async(array, name=name)
        one.append(time.perf_counter() - start)
    submitters.close()
    print(f"two threads {np.median(two) * 1e6:.0f} µs, one thread {np.median(one) * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
