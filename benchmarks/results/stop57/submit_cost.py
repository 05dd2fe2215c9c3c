"""The cost of submitting a repeated asynchronous all-reduce, at one rank (stop 57).

    PYTHONPATH=<tree> python benchmarks/results/stop57/submit_cost.py

200 float32 arrays of 256 values submitted with allreduce_async(a, name=...) in a loop, the
engine told not to cycle meanwhile (overlap off: it gathers until the results are waited for),
then synchronized; 60 steps, µs per request (the minimum and the median step).
"""

import time

import numpy as np

import horovodlite as hvd
from horovodlite.state import current

hvd.init()
current().engine.overlap = False
arrays = [np.ones(256, np.float32) for _ in range(200)]
names = [f"s.{i}" for i in range(200)]
times = []
for _ in range(60):
    start = time.perf_counter()
    handles = [hvd.allreduce_async(a, name=n) for a, n in zip(arrays, names)]
    times.append(time.perf_counter() - start)
    for handle in handles:
        hvd.synchronize(handle)
print(f"submit {np.min(times) / 200 * 1e6:.2f} min, {np.median(times) / 200 * 1e6:.2f} median "
      "µs/request")
