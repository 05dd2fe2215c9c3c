"""On one GPU at one rank: broadcast_, all-gather, all-to-all and reduce-scatter of CUDA tensors
through horovodlite.torch, per call, against torch's NCCL called directly on the same tensors;
then a ResNet-50 training step with ZeroOptimizer (stage 2) against the plain optimizer, in
float32 and bfloat16.

At one rank no byte moves between ranks (horovodlite skips the transport, NCCL copies or does
nothing), so this is each library's own cost a call. Before stop 54 these collectives went
through CuPy views, and bfloat16 (or any dtype without CuPy) was staged through host memory;
since, the tensors travel as they are on torch's NCCL. Run from a copy of this file in the
checkout's `.gpu/`, beside stop 52's `gpu_bf16.py`, whose timing it takes (turns54.sh):
`HOROVODLITE_TRANSPORT=nccl mpiexec -n 1 python3 gpu_movement.py`.
"""

import os
import sys

import horovodlite.torch as hvd
import torch
import torch.distributed as dist

# stop 52's timing (in `.gpu/` the two scripts lie side by side)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "stop52"))
from gpu_bf16 import timed  # noqa: E402

CALLS = 20  # calls a timed step; the result is ms a call
SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20, "64MiB": 64 << 20}


def contenders(group, tensor: torch.Tensor) -> dict:
    """{collective: (horovodlite's call, torch's NCCL call)} on `tensor`."""
    n = tensor.numel()
    broadcast = dist.BroadcastOptions()
    scatter = dist.ReduceScatterOptions()
    scatter.reduceOp = dist.ReduceOp.SUM
    return {
        "broadcast_": (lambda: hvd.broadcast_(tensor, 0),
                       lambda: group.broadcast([tensor], broadcast).wait()),
        "allgather": (lambda: hvd.allgather(tensor),
                      lambda: group._allgather_base(torch.empty_like(tensor), tensor).wait()),
        "alltoall": (lambda: hvd.alltoall(tensor),
                     lambda: group.alltoall_base(torch.empty_like(tensor), tensor, [], [],
                                                 dist.AllToAllOptions()).wait()),
        "reducescatter": (lambda: hvd.reducescatter(tensor, op=hvd.Sum),
                          lambda: group._reduce_scatter_base(
                              torch.empty(n, dtype=tensor.dtype, device="cuda"), tensor,
                              scatter).wait()),
    }  # fmt: skip


def per_call(call) -> float:
    def step():
        for _ in range(CALLS):
            call()

    return round(timed(step) / CALLS, 4)


def zero_steps(dtype) -> dict:
    """ResNet-50 in `dtype`, batch 32: ms a training step with ZeroOptimizer stage 2 (its
    reduce-scatters and shard gathers: torch tensors as they are since stop 54; before, views,
    and for bfloat16 a copy to the host and back each) against the plain optimizer."""
    import torchvision

    out = {}
    images = torch.randn(32, 3, 224, 224, device="cuda").to(dtype)
    for label in ("plain", "zero2"):
        torch.manual_seed(0)
        model = torchvision.models.resnet50().cuda().to(dtype)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        if label == "zero2":
            optimizer = hvd.ZeroOptimizer(optimizer, named_parameters=model.named_parameters(),
                                          stage=2)  # fmt: skip

        def step(model=model, optimizer=optimizer):
            optimizer.zero_grad()
            model(images).float().sum().backward()
            optimizer.step()

        out[label] = round(timed(step), 3)
    return out


def main() -> None:
    hvd.init()
    torch.cuda.set_device(0)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    group = dist.ProcessGroupNCCL(store, 0, 1)
    result = {}
    for dtype in (torch.float32, torch.bfloat16):
        for label, nbytes in SIZES.items():
            tensor = torch.ones(nbytes // dtype.itemsize, dtype=dtype, device="cuda")
            for name, (ours, theirs) in contenders(group, tensor).items():
                key = f"{name}.{str(dtype)[6:]}.{label}"
                result[key] = (per_call(ours), per_call(theirs))
    print("GPUMOVEMENT", os.environ.get("PYTHONPATH") or "new", result, flush=True)
    for dtype in (torch.float32, torch.bfloat16):
        try:
            steps = zero_steps(dtype)
        except Exception as exc:  # (the per-call figures above stand)
            steps = f"{type(exc).__name__}: {exc}"
        print("GPUMOVEMENT zero", str(dtype)[6:], os.environ.get("PYTHONPATH") or "new", steps,
              flush=True)  # fmt: skip
    hvd.shutdown()


if __name__ == "__main__":
    main()
