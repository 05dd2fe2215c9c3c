"""Rank 1 dies (`raise` or `kill`, argv[1]) while the others wait in synchronize()."""

import os
import signal
import sys
import time

import numpy as np

import horovodlite as hvd

hvd.init()
how, engine_busy = sys.argv[1], sys.argv[2] == "busy"
rank = hvd.rank()
# Every rank finishes one collective first, so the engine is warm and its cache holds 'step'.
hvd.synchronize(hvd.allreduce_async(np.ones(4), name="step"))
print(f"rank {rank} ready, pid {os.getpid()}", flush=True)
if rank == 1:
    time.sleep(0.5)
    if how == "raise":
        raise RuntimeError("rank 1 fails on purpose")
    os.kill(os.getpid(), signal.SIGKILL)
if engine_busy:
    hvd.synchronize(hvd.allreduce_async(np.ones(4), name="step"))
else:
    hvd.allreduce(np.ones(4), name="step")
print(f"rank {rank} was not stopped", flush=True)
