"""On one GPU at one rank: ResNet-50's 161 gradients in bfloat16 ("bf16"), or in float32 with
the torch binding's CuPy switched off ("nocupy"): async through the engine, one sync call each,
one sync call each with a postscale, against 161 async calls of torch's NCCL, in one job.

Before stop 52 the async calls and the scaled sync calls of these tensors were staged through
host memory; since, they travel as torch tensors on NCCL. Run from a copy of this file in the
checkout's `.gpu/` (turns52.sh): `mpiexec -n 1 python3 gpu_bf16.py bf16`.
"""

import os
import statistics
import sys
import time

import horovodlite.torch as hvd
import torch
import torch.distributed as dist
import torchvision
from horovodlite.torch import tensors


def timed(step, repeats: int = 10) -> float:
    """Return the median ms of `step()`, the GPU idle before and waited for after."""
    step()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds) * 1e3


def main() -> None:
    hvd.init()
    torch.cuda.set_device(0)
    case = sys.argv[1] if len(sys.argv) > 1 else "bf16"
    dtype = torch.bfloat16 if case == "bf16" else torch.float32
    if case == "nocupy":
        tensors.cupy_holds = lambda dtype: False  # (the binding's view; the core's is its own)
    shapes = [p.shape for p in torchvision.models.resnet50().parameters()]
    grads = [torch.randn(shape, device="cuda").to(dtype) for shape in shapes]
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    group = dist.ProcessGroupNCCL(store, 0, 1)

    def fused():
        handles = [hvd.allreduce_async_(g, name=f"g{i}") for i, g in enumerate(grads)]
        for handle in handles:
            hvd.synchronize(handle)

    def one():
        for i, g in enumerate(grads):
            hvd.allreduce_(g, name=f"g{i}")

    def scaled():
        for i, g in enumerate(grads):
            hvd.allreduce_(g, name=f"s{i}", postscale_factor=0.5)

    def nccl161():
        for work in [group.allreduce([g]) for g in grads]:
            work.wait()

    steps = {"fused161": fused, "one161": one, "scaled161": scaled, "nccl161": nccl161}
    result = {name: round(timed(step), 2) for name, step in steps.items()}
    print("GPUBF16", case, os.environ.get("PYTHONPATH") or "new", result, flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
