"""On one GPU at one rank: ResNet-50's 161 float32 gradients async through the engine, as a
contiguous model's and as a channels_last model's lie (its convolution weights' gradients laid
out channels_last), against 161 async calls of torch's NCCL on the same tensors, in one job.

Before stop 53 a batch holding one channels_last gradient went through CuPy views, all of it;
since, the engine joins such tensors in their logical order and copies their results back. Run
from a copy of this file in the checkout's `.gpu/`, beside stop 52's `gpu_bf16.py`, whose timing
it takes (turns53.sh): `mpiexec -n 1 python3 gpu_layouts.py`.
"""

import functools
import os
import sys

import horovodlite.torch as hvd
import torch
import torch.distributed as dist
import torchvision

# stop 52's timing (in `.gpu/` the two scripts lie side by side)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "stop52"))
from gpu_bf16 import timed  # noqa: E402


def fused(grads: list, names: list) -> None:
    handles = [hvd.allreduce_async_(g, name=n) for g, n in zip(grads, names)]
    for handle in handles:
        hvd.synchronize(handle)


def nccl161(group, grads: list) -> None:
    for work in [group.allreduce([g]) for g in grads]:
        work.wait()


def main() -> None:
    hvd.init()
    torch.cuda.set_device(0)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    group = dist.ProcessGroupNCCL(store, 0, 1)
    result = {}
    for layout in (torch.contiguous_format, torch.channels_last):
        model = torchvision.models.resnet50().cuda().to(memory_format=layout)
        grads = [torch.randn_like(p) for p in model.parameters()]  # (as the parameter lies)
        tag = "channels_last" if layout is torch.channels_last else "contiguous"
        names = [f"{tag}.{i}" for i in range(len(grads))]
        result[f"fused161_{tag}"] = round(timed(functools.partial(fused, grads, names)), 2)
        result[f"nccl161_{tag}"] = round(timed(functools.partial(nccl161, group, grads)), 2)
        result[f"strided_{tag}"] = sum(not g.is_contiguous() for g in grads)
    print("GPULAYOUTS", os.environ.get("PYTHONPATH") or "new", result, flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
