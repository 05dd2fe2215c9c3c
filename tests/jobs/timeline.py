"""Fused and unfused work with a timeline: from HOROVODLITE_TIMELINE (`env`) or start_timeline
(`api`, argv[2] the path)."""

import sys

import numpy as np

import horovodlite as hvd

hvd.init()
mode = sys.argv[1]
if mode == "api":
    hvd.start_timeline(sys.argv[2], mark_cycles=True)
for _step in range(3):
    # Two out of place (their results are views of the fusion buffer) and two in place (their
    # results are copied back out of it): the batch has both copies.
    handles = [(hvd.allreduce_async_ if i >= 2 else hvd.allreduce_async)(
                   np.ones(100 * (i + 1), np.float32), name=f"grad.{i}")
               for i in range(4)]  # fmt: skip
    handles.append(hvd.broadcast_async(np.ones(3), 0, name="weights"))
    handles.append(hvd.allgather_async(np.ones((1, 2)), name="rows"))
    for handle in handles:
        hvd.synchronize(handle)
if mode == "api":
    hvd.stop_timeline()
    # Work after stop_timeline() is not recorded, and does not fail.
    hvd.synchronize(hvd.allreduce_async(np.ones(3), name="after.stop"))
print(f"rank {hvd.rank()} done", flush=True)
