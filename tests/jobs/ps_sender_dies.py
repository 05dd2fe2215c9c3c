"""A rank of a parameter-server job dies in the middle of a message it sends.

argv: who ("server" or "worker"), how ("between-parts": it sent only the first part, the
sizes; "mid-array": it posted a whole message holding a 64 MiB array and exits at once, while
MPICH may still be copying the array out of its memory).

- server: the last rank answers each worker's first pull with such a message and exits; every
  worker must raise the error that names the dead server.
- worker: the last worker sends such a push as its first message and exits; the server must
  take it for dead and go on, and the other workers finish their steps.

A "mid-array" message is a valid one (the array rides along where the receiver ignores it), as
the receiver may win the race and read it whole before the sender is gone.

Runs the framework-free loop (horovodlite.training.ps) with a numpy store, under
`mpiexec -disable-auto-cleanup` (so the job is not torn down at the death itself).
"""

import os
import socket
import sys

import numpy as np
from mpi4py import MPI

from horovodlite import HorovodLiteError
from horovodlite.training.ps import messages
from horovodlite.training.ps import protocol as p
from horovodlite.training.ps.server import ServerLoop
from horovodlite.training.ps.waits import Peer
from horovodlite.training.ps.worker import WorkerClient

STEPS, BIG = 5, 16 * 2**20  # float32 elements: 64 MiB

who, how = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD.Dup()
rank = comm.rank  # (a worker's finish() frees comm)
server, workers = comm.size - 1, list(range(comm.size - 1))
facts = comm.allgather((socket.gethostname(), os.getpid()))
peers = {r: Peer(r, host, pid, host == socket.gethostname()) for r, (host, pid) in enumerate(facts)}
dying = server if who == "server" else workers[-1]


def die_sending(dest: int, tag: int, obj) -> None:
    if how == "between-parts":
        MPI.Comm.Isend(comm, [np.array([100, 4 * BIG], np.int64), MPI.INT64_T], dest, tag)
    else:
        messages.post(comm, obj, dest, tag)
    os._exit(3)  # no finalize: as a crash


class Store:
    """One float32 parameter vector and plain SGD (sparse gradients are ignored)."""

    def __init__(self):
        self.w = np.zeros(4, np.float32)

    def dense(self):
        return [self.w.copy()]

    def sparse(self):
        return {}

    def apply(self, dense, sparse):
        self.w -= np.float32(0.1) * dense[0]


if rank == dying == server:
    for worker in workers:  # take every worker's first pull, then answer it with half a message
        incoming = None
        while incoming is None:
            incoming = messages.arrived(comm, worker, p.PULL)
        incoming.receive(lambda: None)
    die_sending(workers[0], p.PARAMS, (0, [np.zeros(4, np.float32), np.ones(BIG, np.float32)]))
elif rank == dying:
    row = (np.arange(1), np.ones((1, BIG), np.float32))  # an embedding row the store ignores
    die_sending(server, p.PUSH, (0, [np.ones(4, np.float32)], {0: row}))
elif rank == server:
    loop = ServerLoop(comm, workers, peers, Store(), None, silence=60.0)
    report = loop.serve()
    print(f"server done: {report['updates']} updates, dead workers {report['dead_workers']}",
          flush=True)  # fmt: skip
    os._exit(0)  # MPI_Finalize would wait for the dead rank
else:
    client = WorkerClient(comm, [server], peers, {}, timeout=60.0)
    try:
        for _ in range(STEPS):
            client.request_params()
            w = client.receive_params()[0][0]
            assert w.shape == (4,) and w.flags.writeable, (w.shape, w.flags)
            client.push([[np.full(4, rank + 1, np.float32)]], [{}])
        client.request_params()
        client.receive_params()
        finals = client.finish()
        print(f"worker {rank} finished {STEPS} steps: dead workers {finals[0][4]}", flush=True)
    except HorovodLiteError as e:
        print(f"worker {rank}: HorovodLiteError: {e}", flush=True)
    os._exit(0)
