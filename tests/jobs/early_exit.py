"""Rank 1 leaves early (argv[1] says how) while the others wait in a collective (argv[2]).

Ways to leave: `exit0`/`exit1` (sys.exit), `return` (the program just ends), `finally` (an
exception inside try/finally: hvd.shutdown()), `shutdown` (hvd.shutdown(), then a collective),
`os_exit` (os._exit(3): no Python runs), `sigkill` (killed).
Where the others wait: `sync` (an all-reduce), `async` (synchronize() of one), `barrier`.
"""

import os
import signal
import sys
import time

import numpy as np

import horovodlite as hvd


def leave(how: str) -> None:
    if how == "exit0":
        sys.exit(0)
    if how == "exit1":
        sys.exit(1)
    if how == "finally":
        try:
            raise RuntimeError("rank 1 fails inside try/finally")
        finally:
            hvd.shutdown()
    if how == "shutdown":
        hvd.shutdown()
        hvd.allreduce(np.ones(3), name="metric")  # raises here: not initialized
    if how == "os_exit":
        os._exit(3)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    how, where = sys.argv[1], sys.argv[2]
    hvd.init()
    hvd.allreduce(np.ones(3), name="warm")
    rank = hvd.rank()
    print(f"rank {rank} ready, pid {os.getpid()}", flush=True)
    if rank == 1:
        time.sleep(0.3)  # the others are waiting by now
        leave(how)
        return  # `return`: the program ends normally, without the collective
    start = time.monotonic()
    try:
        if where == "sync":
            hvd.allreduce(np.ones(3), name="metric")
        elif where == "async":
            hvd.synchronize(hvd.allreduce_async(np.ones(3), name="metric"))
        else:
            hvd.barrier()
    except hvd.HorovodLiteError as exc:
        print(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {exc}", flush=True)
        raise
    print(f"rank {rank} was not stopped", flush=True)


main()
