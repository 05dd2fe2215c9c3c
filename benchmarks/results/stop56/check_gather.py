"""The metadata check's all-gather alone (stop 56): the check's records (2 + inline_bytes words
per rank) gathered by an MPI_Iallgather posted each time against one persistent all-gather
(MPI_Allgather_init) started each time, both tested in a loop until done (yielding the core
between tests where ranks outnumber cores, as the check's wait does), in paired rounds after a
barrier (the order alternates). Median of each and of the difference per round, µs, over the
slowest rank.

    mpiexec -n 2 python check_gather.py
"""

import os
import sys

import numpy as np
from mpi4py import MPI

from horovodlite.agreement import inline_bytes

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from cpu_twin import paired_rounds  # noqa: E402


def main(rounds: int = 5000) -> None:
    comm = MPI.COMM_WORLD.Dup()
    words = 2 + inline_bytes(comm.size) // 8
    own, everyone = np.zeros(words, np.int64), np.empty((comm.size, words), np.int64)
    persistent = comm.Allgather_init(own, everyone)
    crowded = comm.size > os.cpu_count()

    def settle(request):
        while not request.Test():
            if crowded:
                os.sched_yield()

    def posted():
        settle(comm.Iallgather(own, everyone))

    def started():
        persistent.Start()
        settle(persistent)

    slowest = paired_rounds(comm, (posted, started), rounds)
    slowest = slowest[rounds // 10 :] * 1e6
    if comm.rank == 0:
        posted_us, started_us = np.median(slowest, axis=0)
        difference = np.median(slowest[:, 1] - slowest[:, 0])
        print(f"CHECK_GATHER {comm.size} ranks, {words * 8} bytes a record: Iallgather "
              f"{posted_us:.2f} µs, persistent {started_us:.2f} µs, difference {difference:.2f}",
              flush=True)  # fmt: skip
    persistent.Free()
    comm.Free()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
