"""Every rank but 1 waits for a message from rank 1 on a point-to-point Channel, which never
comes: rank 1 exits (argv[1] `exit0`), shuts horovodlite down (`shutdown`), or is stuck outside
horovodlite (`stuck`: run with a short HOROVODLITE_COLLECTIVE_TIMEOUT). The others must raise
an error naming rank 1, then the job is torn down."""

import sys
import time

import numpy as np

import horovodlite as hvd
from horovodlite.training.point_to_point import Channel

how = sys.argv[1]
hvd.init()
channel = Channel()
rank = hvd.rank()
hvd.allreduce(np.ones(2), name="warm")
if rank == 1:
    time.sleep(0.3)  # the others are waiting by now
    if how == "exit0":
        sys.exit(0)
    if how == "shutdown":
        hvd.shutdown()
        time.sleep(60)
    if how == "stuck":
        time.sleep(60)  # far longer than the timeout
    print(f"rank {rank} was not torn down", flush=True)
    sys.exit(0)
start = time.monotonic()
try:
    channel.recv(np.empty(4), 1, tag=5)
except hvd.HorovodLiteError as exc:
    print(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {exc}", flush=True)
    time.sleep(30)  # caught: the job is torn down all the same
print(f"rank {rank} was not stopped", flush=True)
