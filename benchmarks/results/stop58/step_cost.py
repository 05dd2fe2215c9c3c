"""A repeated asynchronous step at one rank: µs to submit, and for the whole step (stop 58).

    PYTHONPATH=<tree> python benchmarks/results/stop58/step_cost.py

200 float32 arrays of 256 values submitted with allreduce_async(a, name=...) from the main
thread, the engine told not to cycle meanwhile (overlap off), then synchronized; 400 steps, the
first 50 not counted; the minimum and median step, the submitting and the rest (the engine's
cycle and the 200 synchronize() calls). One rank moves no bytes: this is the Python per request.
"""

import time

import numpy as np

import horovodlite as hvd
from horovodlite.state import current

hvd.init()
current().engine.overlap = False
arrays = [np.ones(256, np.float32) for _ in range(200)]
names = [f"s.{i}" for i in range(200)]
submit, whole = [], []
for _ in range(400):
    start = time.perf_counter()
    handles = [hvd.allreduce_async(a, name=n) for a, n in zip(arrays, names)]
    submitted = time.perf_counter()
    for handle in handles:
        hvd.synchronize(handle)
    submit.append(submitted - start)
    whole.append(time.perf_counter() - start)
submit, whole = np.array(submit[50:]) * 1e6, np.array(whole[50:]) * 1e6
print(f"step {np.min(whole):.0f} min {np.median(whole):.0f} med; submit {np.min(submit):.0f} min "
      f"{np.median(submit):.0f} med; engine+sync {np.median(whole - submit):.0f} med µs")
