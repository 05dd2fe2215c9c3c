"""Where horovodlite's cost beside Gloo's own call goes: a 1 KiB torch all-reduce at 2 ranks
over HOROVODLITE_TRANSPORT=gloo, taken apart. Usage:

    mpiexec -n 2 python twin_parts.py a|b|c      # a, b, c: the sets of variants below

Each round runs every variant of the set once, in a shuffled order that all ranks share, each
after an MPI barrier; a variant's time in a round is the slowest rank's. Printed: each
variant's median over 1500 rounds, and the median of its difference from `gloo` (torch's
ProcessGroupGloo.allreduce on a clone, on the very group horovodlite moves data on) round by
round.
"""

import os
import random
import statistics
import sys
import time

os.environ["HOROVODLITE_TRANSPORT"] = "gloo"

import horovodlite.torch as hvd  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from horovodlite.torch.tensors import TORCH_TENSORS  # noqa: E402
from mpi4py import MPI  # noqa: E402

from horovodlite.agreement import _records_for, same_everywhere  # noqa: E402
from horovodlite.ops import ReduceOp  # noqa: E402
from horovodlite.small_allreduce import _tensor_route, tensor_allreduce  # noqa: E402
from horovodlite.state import current  # noqa: E402
from horovodlite.transport import select  # noqa: E402

hvd.init()
comm = MPI.COMM_WORLD
t = torch.ones(256)
for _ in range(50):
    hvd.allreduce(t, op=hvd.Sum, name="w")
state = current()
transport = select(state.settings, np, ReduceOp.SUM, np.dtype(np.float32))
pg = transport.group(state.comm).backend
wait = state.watch.check_waiter(lambda: ("x", 1), range(comm.size))
opts = dist.AllreduceOptions()
opts.reduceOp = dist.ReduceOp.SUM
args = dict(op=ReduceOp.SUM, prescale_factor=1.0, postscale_factor=1.0)
own_r, transport_r, wait_r = _tensor_route(t, TORCH_TENSORS, ReduceOp.SUM, "w", None, state)[:3]


def gloo():
    pg.allreduce([t.clone()], opts).wait()


def barrier_gloo():
    comm.Barrier()
    gloo()


def check_gloo():  # horovodlite's check (an Iallgather it polls), then Gloo's own call
    same_everywhere(state.comm, 12345, wait)
    gloo()


def check_copy_pg():
    same_everywhere(state.comm, 12345, wait)
    out = torch.empty_like(t)
    out[...] = t
    pg.allreduce([out], opts).wait()


def check_transport():  # the check, then the transport's all-reduce into a new tensor
    same_everywhere(state.comm, 12345, wait)
    out = torch.empty_like(t)
    transport.allreduce(state.comm, out.view(-1), ReduceOp.SUM, np, "gloo", None, t.view(-1))


def route_transport():  # the same with the digest and wait tensor_allreduce keeps
    same_everywhere(state.comm, own_r, wait_r)
    out = torch.empty_like(t)
    transport_r.allreduce(state.comm, out.view(-1), ReduceOp.SUM, np, "gloo", None, t.view(-1))


def other_digest_route_wait():
    same_everywhere(state.comm, 12345, wait_r)
    out = torch.empty_like(t)
    transport.allreduce(state.comm, out.view(-1), ReduceOp.SUM, np, "gloo", None, t.view(-1))


def direct():  # the core's short way for a framework tensor, without the binding
    tensor_allreduce(t, TORCH_TENSORS, "w", False, dict(args))


def hvd_call():  # all of it: horovodlite.torch.allreduce
    hvd.allreduce(t, op=hvd.Sum, name="w")


def _records():
    records = _records_for(state.comm.size)
    records.own[0], records.own[1] = 12345, 0
    return records


def iallgather_wait_gloo():  # the check's exchange, waited for in MPI's C code
    records = _records()
    state.comm.Iallgather(records.own, records.everyone).Wait()
    gloo()


def iallgather_test_gloo():  # ... polled with Test() in a bare loop
    records = _records()
    request = state.comm.Iallgather(records.own, records.everyone)
    while not request.Test():
        pass
    gloo()


def allgather_gloo():  # ... as a blocking Allgather
    records = _records()
    state.comm.Allgather(records.own, records.everyone)
    gloo()


SETS = {
    "a": {"hvd": hvd_call, "tensor_allreduce": direct, "check+transport.allreduce":
          check_transport, "check+empty+copy+pg": check_copy_pg, "check+gloo": check_gloo,
          "gloo": gloo},
    "b": {"route+transport": route_transport, "12345+routewait": other_digest_route_wait,
          "hvd": hvd_call, "tensor_allreduce": direct, "check+transport.allreduce":
          check_transport, "check+empty+copy+pg": check_copy_pg, "check+gloo": check_gloo,
          "gloo": gloo},
    "c": {"Iallgather+Wait+gloo": iallgather_wait_gloo, "Iallgather+Test loop+gloo":
          iallgather_test_gloo, "Allgather+gloo": allgather_gloo, "barrier+gloo": barrier_gloo,
          "check+gloo": check_gloo, "gloo": gloo},
}  # fmt: skip
fns = SETS[sys.argv[1]]
times = {k: [] for k in fns}
rng = random.Random(1)
order = list(fns)
for _ in range(1500):
    rng.shuffle(order)
    order = comm.bcast(order, root=0)
    for k in order:
        comm.Barrier()
        t0 = time.perf_counter()
        fns[k]()
        times[k].append(max(comm.allgather(time.perf_counter() - t0)))
if comm.rank == 0:
    base = times["gloo"]
    for k, v in times.items():
        d = [a - b for a, b in zip(v, base)]
        print(f"{k}: median {statistics.median(v) * 1e6:.1f} us, "
              f"minus gloo paired {statistics.median(d) * 1e6:.1f} us")  # fmt: skip
hvd.shutdown()
