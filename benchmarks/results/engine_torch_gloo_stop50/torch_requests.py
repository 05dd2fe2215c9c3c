"""Per-request cost of torch's async all-reduce through the engine, on the CPU twin (gloo).

    HOROVODLITE_TRANSPORT=gloo mpiexec -n 2 python torch_requests.py [--count 161 --values 256]
    mpiexec -n 1 python torch_requests.py      # MPI's transport: the tensors go as numpy views

`--count` tensors of `--values` float32 each, every step, named alike each step as a training
loop's gradients; each step starts after a barrier and counts the slowest rank:
  * torch async_:   horovodlite.torch.allreduce_async_ on each tensor, then synchronize each,
  * torch async:    the same, out of place,
  * numpy async_:   the core's allreduce_async_ on numpy arrays (the engine without a binding),
  * gloo one:       torch.distributed's Gloo all-reduce of all the values in one tensor, on the
                    engine's own group (the transfer alone, nothing of horovodlite around it).
The contenders take turns in a shuffled order each repeat; prints medians in ms per step, µs
per tensor, and rank 0's CPU time per step (all its threads: what load disturbs less) as JSON.
"""

import argparse
import json
import random
import time

import horovodlite.torch as hvd
import numpy as np
import torch
from mpi4py import MPI

import horovodlite as core


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=161)
    parser.add_argument("--values", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    count, values = args.count, args.values
    tensors = [torch.full((values,), float(hvd.rank())) for _ in range(count)]
    arrays = [np.full(values, float(hvd.rank()), np.float32) for _ in range(count)]
    flat = torch.zeros(count * values)
    state = core.state.current()
    comm = state.process_sets.lookup(0).engine_comm
    gloo = core.transport.select(state.settings, np)  # (MPI unless HOROVODLITE_TRANSPORT=gloo)

    def torch_async(inplace):
        start = hvd.allreduce_async_ if inplace else hvd.allreduce_async

        def step():
            handles = [start(t, name=f"t.{inplace}.{i}") for i, t in enumerate(tensors)]
            for handle in handles:
                hvd.synchronize(handle)

        return step

    def numpy_async():
        handles = [core.allreduce_async_(a, name=f"n.{i}") for i, a in enumerate(arrays)]
        for handle in handles:
            core.synchronize(handle)

    def gloo_one():
        gloo.allreduce_tensor(comm, flat, None, core.Sum)

    contenders = {
        "torch async_": torch_async(True),
        "torch async": torch_async(False),
        "numpy async_": numpy_async,
    }
    if gloo.name == "gloo":
        contenders["gloo one"] = gloo_one
    for step in contenders.values():  # the first step agrees on the names
        step()
    times = {name: [] for name in contenders}
    cpu = {name: [] for name in contenders}
    world = state.comm
    for _ in range(args.repeats):
        order = list(contenders)
        random.Random(len(times["numpy async_"])).shuffle(order)  # alike on every rank
        for name in order:
            world.Barrier()
            began, cpu_began = time.perf_counter(), time.process_time()
            contenders[name]()
            took = world.allreduce(time.perf_counter() - began, op=MPI.MAX)
            times[name].append(took)
            cpu[name].append(time.process_time() - cpu_began)
    if hvd.rank() == 0:
        out = {
            name: {"median_ms": 1e3 * float(np.median(t)),
                   "us_per_tensor": 1e6 * float(np.median(t)) / count,
                   "cpu_ms_rank0": 1e3 * float(np.median(cpu[name]))}
            for name, t in times.items()
        }  # fmt: skip
        out["ranks"], out["count"], out["values"] = hvd.size(), count, values
        print(json.dumps(out))


if __name__ == "__main__":
    main()
