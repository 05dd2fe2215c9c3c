"""The engine's torch tensors over Gloo: 161 gradients async and fused, contiguous or
channels_last, against one synchronous call each, in turns in one job.

    HOROVODLITE_TRANSPORT=gloo mpiexec -n 1 python layouts.py

Two batches of 161 float32 tensors: "small" (256 values each, all 1-D) and "tiny" (ResNet-50's
parameter shapes with every dimension cut to at most 4, 4-D ones included, so that the per-tensor
cost shows, not the copies), the latter also with its 4-D tensors channels_last, as a
channels_last model's gradients lie. Each step starts after a barrier and counts the slowest
rank; prints the medians of 60 steps in ms, one line per batch.
"""

import os
import statistics
import sys
import time

import torch
from mpi4py import MPI

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # benchmarks/
import horovodlite.torch as hvd  # noqa: E402
from engine_fusion import RESNET50_SHAPES  # noqa: E402

ROUNDS = 60


def batches() -> dict:
    tiny = [tuple(min(d, 4) for d in shape) for shape in RESNET50_SHAPES]
    last = [
        torch.randn(shape).contiguous(memory_format=torch.channels_last)
        if len(shape) == 4
        else torch.randn(shape)
        for shape in tiny
    ]
    return {
        "small": [torch.randn(256) for _ in RESNET50_SHAPES],
        "tiny": [torch.randn(shape) for shape in tiny],
        "tiny_channels_last": last,
    }


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD

    def fused(grads, names):
        handles = [hvd.allreduce_async_(g, name=name) for g, name in zip(grads, names)]
        for handle in handles:
            hvd.synchronize(handle)

    def one(grads, names):
        for g, name in zip(grads, names):
            hvd.allreduce_(g, name=name)

    def timed(step, grads, names) -> float:
        comm.Barrier()
        start = time.perf_counter()
        step(grads, names)
        return comm.allreduce(time.perf_counter() - start, op=MPI.MAX)

    every = batches()
    # Each batch's own names, as a training step's gradients keep theirs from step to step.
    names = {name: [f"{name}.{i}" for i in range(len(grads))] for name, grads in every.items()}
    strided = sum(not g.is_contiguous() for g in every["tiny_channels_last"])
    times = {(name, step.__name__): [] for name in every for step in (fused, one)}
    for name, grads in every.items():
        fused(grads, names[name]), one(grads, names[name])
    for _ in range(ROUNDS):
        for name, grads in every.items():
            for step in (fused, one):
                times[name, step.__name__].append(timed(step, grads, names[name]))
    if comm.rank == 0:
        tree = os.environ.get("PYTHONPATH") or "new"
        for name in every:
            medians = {step: round(statistics.median(times[name, step]) * 1e3, 3)
                       for step in ("fused", "one")}  # fmt: skip
            print("LAYOUTS", tree, comm.size, name, medians, f"strided {strided}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
