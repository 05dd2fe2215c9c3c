"""Stalls: the last rank is late to submit 'lonely' (`warn`) or submits 'other' instead
(`shutdown`). Run with HOROVODLITE_STALL_CHECK_TIME_SECONDS=1 (and for `shutdown`
HOROVODLITE_STALL_SHUTDOWN_TIME_SECONDS=2)."""

import logging
import sys
import threading

import numpy as np
from mpi4py import MPI

import horovodlite as hvd

hvd.init()
mode = sys.argv[1]
rank, last = hvd.rank(), hvd.size() - 1
warned = threading.Event()


class Watch(logging.Handler):
    def emit(self, record):
        if "stall" in record.getMessage():
            warned.set()


logging.getLogger("horovodlite").addHandler(logging.StreamHandler(sys.stdout))
logging.getLogger("horovodlite").addHandler(Watch())
x = np.ones(3)
if mode == "warn":
    if rank == last:
        # Late, but not too late: rank 0 says when it has warned about this rank.
        MPI.COMM_WORLD.recv(source=0, tag=7)
        out = hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum, name="lonely"))
    else:
        handle = hvd.allreduce_async(x, op=hvd.Sum, name="lonely")
        if rank == 0:
            warned.wait()
            MPI.COMM_WORLD.send(True, dest=last, tag=7)
        out = hvd.synchronize(handle)
    assert (out == hvd.size()).all()
    print(f"rank {rank} finished", flush=True)
else:
    name = "other" if rank == last else "lonely"
    handle = hvd.allreduce_async(x, op=hvd.Sum, name=name)
    try:
        hvd.synchronize(handle)
        print(f"rank {rank} was not stopped", flush=True)
    except hvd.HorovodLiteError as exc:
        print(f"rank {rank} raised: {exc}", flush=True)
    try:
        hvd.allreduce_async(x, name="after")
        print(f"rank {rank} could still submit", flush=True)
    except hvd.HorovodLiteError:
        print(f"rank {rank} refuses new requests", flush=True)
