"""Rank 0 calls a synchronous all-reduce 'g'; the others submit 'g' asynchronously. Every rank
must raise MismatchError (argv[1] == "caught": and carry on, until the job is torn down)."""

import time

import numpy as np

import horovodlite as hvd

hvd.init()
rank = hvd.rank()
hvd.allreduce(np.ones(2), name="warm")
start = time.monotonic()
try:
    if rank == 0:
        hvd.allreduce(np.ones(3), name="g")
    else:
        hvd.synchronize(hvd.allreduce_async(np.ones(3), name="g"))
    print(f"rank {rank} was not stopped", flush=True)
except hvd.MismatchError as exc:
    print(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    time.sleep(30)  # caught: the job is torn down all the same
print(f"rank {rank} was not torn down", flush=True)
