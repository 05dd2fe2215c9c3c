"""Rank 0 calls a synchronous collective while the others wait on an asynchronous all-reduce.

argv[1] says which synchronous call rank 0 makes: "same" (an all-reduce under the async one's
own name), "allreduce" (under another name), "barrier", or "remove_process_set" (an internal
agreement over all ranks); or "reverse": rank 0 waits on the asynchronous all-reduce 'g' and
the others call it synchronously. Neither side can go on: every rank must raise MismatchError naming
the ranks and both collectives, and the job is torn down even where the error is caught.
"""

import sys
import time

import numpy as np

import horovodlite as hvd

how = sys.argv[1] if len(sys.argv) > 1 else "same"
hvd.init()
rank = hvd.rank()
process_set = hvd.add_process_set(list(range(hvd.size())))
hvd.allreduce(np.ones(2), name="warm")
start = time.monotonic()
try:
    if how == "reverse":
        if rank == 0:
            hvd.synchronize(hvd.allreduce_async(np.ones(3), name="g"))
        else:
            if rank == hvd.size() - 1:
                time.sleep(1.5)  # arrives after rank 0 found the others: it must learn it too
            hvd.allreduce(np.ones(3), name="g")
    elif rank == 0:
        if how == "same":
            hvd.allreduce(np.ones(3), name="g")
        elif how == "allreduce":
            hvd.allreduce(np.ones(3), name="sync.x")
        elif how == "barrier":
            hvd.barrier()
        else:
            hvd.remove_process_set(process_set)
    else:
        hvd.synchronize(hvd.allreduce_async(np.ones(3), name="g"))
    print(f"rank {rank} was not stopped", flush=True)
except hvd.MismatchError as exc:
    # One write per line: the ranks' lines reach the launcher's output whole.
    sys.stdout.write(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {exc}\n")
    sys.stdout.flush()
    time.sleep(30)  # caught: the job is torn down all the same
print(f"rank {rank} was not torn down", flush=True)
