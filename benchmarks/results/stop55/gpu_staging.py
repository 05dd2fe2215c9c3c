"""CuPy arrays staged through host memory (`HOROVODLITE_TRANSPORT=mpi`, no CUDA-aware MPI): ms
a call and GB/s of the array's bytes, for the all-reduce (fused and single), broadcast_,
all-gather, all-to-all and reduce-scatter, at 64 MiB and 1 MiB.

Since stop 55 every staged collective goes through reused pinned host buffers (before: the
all-reduce's fused batch down only; the rest through pageable memory, and every result up
through CuPy's own pinned bounce). Run from a copy in the checkout's `.gpu/`, at 1 rank, or at
2 ranks sharing the GPU (MPI moves host memory, so they may):
`HOROVODLITE_TRANSPORT=mpi HOROVODLITE_CUDA_AWARE_MPI=0 mpiexec -n 2 python3 gpu_staging.py`.
"""

import json
import statistics
import time

import cupy
import numpy as np

import horovodlite as hvd

REPEATS = 7
CALLS = 10


def timed(call) -> float:
    """Median ms a call over REPEATS steps of CALLS calls, the ranks lined up before each."""
    call()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(REPEATS):
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        cupy.cuda.Device().synchronize()
        times.append((time.perf_counter() - start) * 1e3 / CALLS)
    return statistics.median(times)


def calls(count: int, n: int) -> dict:
    """{name: a call} on `count` float32 elements of CuPy arrays."""
    x = cupy.arange(count, dtype=cupy.float32) % 7
    z = x.copy()  # reduced in place: doubles at 2 ranks a call, far from float32's range
    parts = [cupy.arange(count // 64, dtype=cupy.float32) for _ in range(64)]

    def fused():
        handles = [hvd.allreduce_async(p, op=hvd.Sum, name=f"p{i}") for i, p in enumerate(parts)]
        for handle in handles:
            hvd.synchronize(handle)

    return {
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Sum),
        "allreduce_": lambda: hvd.allreduce_(z, op=hvd.Sum),
        "allreduce_async 64 parts": fused,
        "broadcast_": lambda: hvd.broadcast_(x, 0),
        "allgather": lambda: hvd.allgather(x[: count // n]),
        "alltoall": lambda: hvd.alltoall(x),
        "reducescatter": lambda: hvd.reducescatter(x, op=hvd.Sum),
    }


def main() -> None:
    hvd.init()
    n = hvd.size()
    results = {}
    for label, nbytes in (("64MiB", 64 << 20), ("1MiB", 1 << 20)):
        for name, call in calls(nbytes // 4 // n * n, n).items():
            ms = timed(call)
            results[f"{name} {label}"] = {"ms": round(ms, 3), "GB/s": round(nbytes / ms / 1e6, 2)}
    # The values, once, so that a wrong staging shows here too.
    y = cupy.full(1000, hvd.rank() + 1, dtype=cupy.float32)
    expected = n * (n + 1) / 2
    assert float(hvd.allreduce(y, op=hvd.Sum)[0]) == expected
    assert cupy.asnumpy(hvd.allgather(y)).reshape(n, -1)[:, 0].tolist() == list(range(1, n + 1))
    if hvd.rank() == 0:
        print("GPUSTAGING", json.dumps({"ranks": n, **results}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
