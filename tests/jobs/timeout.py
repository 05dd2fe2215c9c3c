"""The last rank never arrives at a collective (argv[1]: `sync` or `async`); run with a short
HOROVODLITE_COLLECTIVE_TIMEOUT. The others must raise naming it, then the job is torn down."""

import sys
import time

import numpy as np

import horovodlite as hvd

hvd.init()
rank, last = hvd.rank(), hvd.size() - 1
hvd.allreduce(np.ones(2), name="warm")
if rank == last:
    time.sleep(60)  # stuck outside horovodlite, far longer than the timeout
    print(f"rank {rank} was not torn down", flush=True)
    sys.exit(0)
start = time.monotonic()
try:
    if sys.argv[1] == "sync":
        hvd.allreduce(np.ones(2), name="late")
    else:
        hvd.synchronize(hvd.allreduce_async(np.ones(2), name="late"))
except hvd.HorovodLiteError as exc:
    print(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    time.sleep(30)  # caught: the job is torn down all the same
print(f"rank {rank} was not torn down", flush=True)
