"""float16 gradients through the torch binding's async all-reduce: Compression.fp16's case.

    mpiexec -n 2 python half_requests.py --shapes resnet50            # MPI (the default)
    HOROVODLITE_TRANSPORT=gloo mpiexec -n 2 python half_requests.py --shapes small

Every step all-reduces (Average, in place) the same float16 tensors (`--dtype float32` for the
comparison), named alike each step as a training loop's gradients: ResNet-50's 161 gradient
shapes (25.6 M values), or 161 tensors of 512 values (1 KiB each). Each step starts after a
barrier and counts the slowest rank:
  * async_:      horovodlite.torch.allreduce_async_ on each tensor, then synchronize each,
  * one buffer:  horovodlite.torch.allreduce_ on one tensor of all the values (our floor).
The contenders take turns in a shuffled order each repeat; prints the medians (ms a step) as JSON.
"""

import argparse
import json
import os
import random
import sys
import time

import horovodlite.torch as hvd
import numpy as np
import torch
from mpi4py import MPI

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from engine_fusion import RESNET50_SHAPES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", choices=["resnet50", "small"], default="resnet50")
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    shapes = RESNET50_SHAPES if args.shapes == "resnet50" else [(512,)] * 161
    rng = np.random.default_rng(hvd.rank())
    tensors = [torch.from_numpy(rng.standard_normal(s).astype(args.dtype)) for s in shapes]
    flat = torch.cat([t.view(-1) for t in tensors])
    comm = MPI.COMM_WORLD

    def async_():
        handles = [hvd.allreduce_async_(t, name=f"grad.{i}") for i, t in enumerate(tensors)]
        for handle in handles:
            hvd.synchronize(handle)

    def one_buffer():
        hvd.allreduce_(flat, name="flat")

    steps = {"async_": async_, "one buffer": one_buffer}
    times = {name: [] for name in steps}
    for step in steps.values():
        step()  # (the kept routes and buffers)
    for _ in range(args.repeats):
        order = list(steps)
        random.Random(len(times["async_"])).shuffle(order)
        for name in order:
            comm.Barrier()
            start = time.perf_counter()
            steps[name]()
            times[name].append(max(comm.allgather(time.perf_counter() - start)))
    if hvd.rank() == 0:
        medians = {name: 1e3 * float(np.median(t)) for name, t in times.items()}
        medians["ratio"] = medians["async_"] / medians["one buffer"]
        print(json.dumps({"shapes": args.shapes, "ranks": hvd.size(), "ms": medians}))


if __name__ == "__main__":
    main()
