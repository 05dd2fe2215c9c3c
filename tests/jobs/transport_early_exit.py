"""Rank 1 leaves (argv[2]: `exit0` or `exit1`, sys.exit) after data moved over transport
argv[1]; the others then all-reduce on the transport's device and must raise, not hang in it.

argv[1] is `gloo` (host tensors), `nccl` (torch CUDA tensors) or `cupy-nccl` (CuPy arrays).
"""

import os
import sys
import time

import horovodlite.torch as hvd  # registers the gloo and nccl transports


def data(transport: str, rank: int):
    import torch

    if transport == "cupy-nccl":
        import cupy

        cupy.cuda.Device(hvd.local_rank() % cupy.cuda.runtime.getDeviceCount()).use()
        return cupy.ones(3, dtype=cupy.float32) * rank
    if transport == "nccl":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        return torch.ones(3, device="cuda") * rank
    return torch.ones(3) * rank


def main() -> None:
    transport, how = sys.argv[1], sys.argv[2]
    os.environ["HOROVODLITE_TRANSPORT"] = transport
    hvd.init()
    rank = hvd.rank()
    allreduce = hvd.allreduce
    if transport == "cupy-nccl":
        import horovodlite as core

        allreduce = core.allreduce
    allreduce(data(transport, rank), name="warm")  # builds the transport's group
    print(f"rank {rank} ready, pid {os.getpid()}", flush=True)
    if rank == 1:
        time.sleep(0.3)  # the others are waiting by now
        sys.exit(1 if how == "exit1" else 0)
    start = time.monotonic()
    try:
        allreduce(data(transport, rank), name="metric")
    except hvd.HorovodLiteError as exc:
        print(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {exc}", flush=True)
        raise
    print(f"rank {rank} was not stopped", flush=True)


main()
