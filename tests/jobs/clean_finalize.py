"""Runs that end in MPI_Finalize, normally or after caught failures (argv[1] says which):

`normal` (async and sync collectives, a process set, join), `restart` (shutdown() and init()
three times), `mismatch` (a mismatch raised on every rank, caught): every rank ends with exit
status 0. `early`, `early_exit`, `early_async`: rank 1 shuts down (or exits) while the others
wait in a synchronous collective (or an asynchronous one): they catch the error and end; where
their half of the collective stays posted, they abort the job at exit rather than finalize.
The test checks that MPI found no message left unreceived.
"""

import sys

import numpy as np

import horovodlite as hvd


def work(tag: str) -> None:
    rank, size = hvd.rank(), hvd.size()
    handles = [
        hvd.allreduce_async(np.full(7, rank), op=hvd.Sum, name=f"{tag}.a{i}") for i in range(3)
    ]
    handles.append(hvd.allgather_async(np.ones((rank, 2)), name=f"{tag}.g"))
    assert [int(x) for x in hvd.synchronize(handles[0])] == [size * (size - 1) // 2] * 7
    for handle in handles[1:]:
        hvd.synchronize(handle)
    hvd.allreduce(np.ones(3), name=f"{tag}.s")
    hvd.broadcast(np.ones(4), root_rank=size - 1, name=f"{tag}.b")
    hvd.barrier()


how = sys.argv[1]
hvd.init()
rank, size = hvd.rank(), hvd.size()
if how == "normal":
    work("n")
    evens = hvd.add_process_set(list(range(0, size, 2)))
    if rank % 2 == 0:
        hvd.allreduce(np.ones(2), name="evens", process_set=evens)
    hvd.remove_process_set(evens)
    if rank == 0:
        hvd.join()
    else:
        hvd.synchronize(hvd.allreduce_async(np.ones(2), name="before.join"))
        hvd.join()
elif how == "restart":
    for round in range(3):
        work(f"r{round}")
        hvd.shutdown()
        hvd.init()
    work("last")
elif how == "mismatch":
    for call in ("sync", "async"):
        shape = (3,) if rank == 0 else (4,)
        try:
            if call == "sync":
                hvd.allreduce(np.ones(shape), name="bad")
            else:
                hvd.synchronize(hvd.allreduce_async(np.ones(shape), name="bad.async"))
            raise SystemExit(f"rank {rank}: no mismatch raised")
        except hvd.MismatchError:
            pass
    work("after")
elif how.startswith("early"):  # early (shutdown), early_exit (sys.exit), early_async
    work("e")
    if rank == 1:
        if how == "early_exit":
            sys.stdout.write(f"rank {rank} done\n")
            sys.exit(0)
        hvd.shutdown()
    else:
        try:
            if how == "early_async":
                hvd.synchronize(hvd.allreduce_async(np.ones(3), name="never"))
            else:
                hvd.allreduce(np.ones(3), name="never")
            raise SystemExit(f"rank {rank}: no error")
        except hvd.HorovodLiteError:
            pass
sys.stdout.write(f"rank {rank} done\n")  # one write: the ranks' lines reach the output whole
