"""All-reduce random float32 tensors asynchronously; rank 0 saves the results to argv[1]."""

import sys

import numpy as np

import horovodlite as hvd

hvd.init()
rng = np.random.default_rng([42, hvd.rank()])
shapes = [(1000,), (3, 7), (1,), (64, 64), (0,), (5, 5, 5), (300,)]
results = []
for _step in range(2):
    handles = [
        hvd.allreduce_async(rng.standard_normal(s).astype(np.float32), name=f"w{i}", op=op)
        for i, s in enumerate(shapes)
        for op in [hvd.Average if i % 2 else hvd.Sum]
    ]
    handles.append(hvd.grouped_allreduce_async(
        [rng.standard_normal(s).astype(np.float32) for s in shapes], name="g", postscale_factor=0.3
    ))  # fmt: skip
    for handle in handles:
        out = hvd.synchronize(handle)
        results += out if isinstance(out, list) else [out]
if hvd.rank() == 0:
    np.savez(sys.argv[1], *results)
print(f"rank {hvd.rank()} done", flush=True)
