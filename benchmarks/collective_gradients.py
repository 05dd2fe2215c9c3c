"""Collectives inside a model: forward and backward of a differentiable collective.

    mpiexec -n 2 python benchmarks/collective_gradients.py          # prints a table
    mpiexec -n 2 python benchmarks/collective_gradients.py --out results/collective_gradients.json

In one MPI job, float32 tensors of --values elements, each call a forward through the collective
and a backward of the sum of its output (the contenders taking turns block by block; each block
starts after a barrier and keeps the slowest rank's mean; the median of --repeats blocks):

    hvd allreduce       horovodlite.torch.allreduce(x, op=Sum)
    gloo all_reduce     torch.distributed.nn.functional.all_reduce(x) on a Gloo group: torch's
                        own differentiable collective (torch 2.13 marks these deprecated in
                        favour of functional collectives; they still run)
    hvd allgather       horovodlite.torch.allgather(x)
    gloo all_gather     torch.distributed.nn.functional.all_gather(x), concatenated
    hvd allreduce Max   horovodlite.torch.allreduce(x, op=Max) (its gradient needs 3 collectives)
    hvd SyncBatchNorm   horovodlite.torch.SyncBatchNorm(16) on a batch of 8x16x4x4
    jax grad allreduce  jax.jit(jax.grad(sum of horovodlite.jax.allreduce(x, op=Sum)))
    jax grad allgather  the same with allgather

Only the forward contenders of the frameworks installed run. Each gradient is checked against its
formula (the gradient of the sum of the ranks' losses, docs/equivalence.md).
"""

import argparse
import json
import os
import warnings

import numpy as np
from mpi4py import MPI
from training_jobs import timed_in_turns

CONTENDERS = ("hvd allreduce", "gloo all_reduce", "hvd allgather", "gloo all_gather",
              "hvd allreduce Max", "hvd SyncBatchNorm", "jax grad allreduce",
              "jax grad allgather")  # fmt: skip


def torch_calls(comm, values: int, checks: dict) -> dict:
    """The torch contenders; each records its input gradient in `checks` against the formula."""
    try:
        import horovodlite.torch as hvd
        import torch
        import torch.distributed as dist
        import torch.distributed.nn.functional as dnn
    except ImportError:
        return {}
    warnings.filterwarnings("ignore", "torch.distributed.nn.functional", FutureWarning)
    hvd.init()
    n = comm.size
    port = comm.bcast(29500 + os.getpid() % 1000 if comm.rank == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                            world_size=n)  # fmt: skip
    x = torch.full((values,), float(comm.rank + 1), requires_grad=True)

    def backward_of(name, forward, want):
        def call():
            x.grad = None
            forward().sum().backward()
            checks[name] = bool(torch.allclose(x.grad, torch.full_like(x, want)))

        return call

    calls = {
        # d(sum over ranks of sum(allreduce(x)))/dx = n; of an allgather's, also n.
        "hvd allreduce": backward_of("hvd allreduce", lambda: hvd.allreduce(x, op=hvd.Sum), n),
        "gloo all_reduce": backward_of("gloo all_reduce", lambda: dnn.all_reduce(x), n),
        "hvd allgather": backward_of("hvd allgather", lambda: hvd.allgather(x), n),
        "gloo all_gather": backward_of(
            "gloo all_gather", lambda: torch.cat(dnn.all_gather(x)), n),
        # Max: the whole upstream sum goes to the one rank holding the maximum (the last).
        "hvd allreduce Max": backward_of(
            "hvd allreduce Max", lambda: hvd.allreduce(x, op=hvd.Max),
            n if comm.rank == n - 1 else 0),
    }  # fmt: skip
    norm = hvd.SyncBatchNorm(16)
    batch = torch.randn(8, 16, 4, 4, generator=torch.Generator().manual_seed(comm.rank),
                        requires_grad=True)  # fmt: skip

    def sync_batch_norm():
        batch.grad = None
        norm(batch).sum().backward()
        checks["hvd SyncBatchNorm"] = bool(torch.isfinite(batch.grad).all())

    calls["hvd SyncBatchNorm"] = sync_batch_norm
    return calls


def jax_calls(comm, values: int, checks: dict) -> dict:
    try:
        import horovodlite.jax as hj
        import jax
        import jax.numpy as jnp
    except ImportError:
        return {}
    hj.init()
    n = comm.size
    x = jnp.full((values,), float(comm.rank + 1))
    calls = {}
    for name, collective in (("jax grad allreduce", lambda a: hj.allreduce(a, op=hj.Sum)),
                             ("jax grad allgather", hj.allgather)):  # fmt: skip
        grad = jax.jit(jax.grad(lambda a, c=collective: jnp.sum(c(a))))

        def call(name=name, grad=grad):
            got = jax.block_until_ready(grad(x))
            checks[name] = bool(np.allclose(np.asarray(got), n))

        calls[name] = call
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=256, help="float32 elements per tensor")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.1)
    parser.add_argument("--out", default=None, help="write the rows as JSON here (rank 0)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    checks = {}
    calls = {**torch_calls(comm, args.values, checks), **jax_calls(comm, args.values, checks)}
    medians = timed_in_turns(comm, calls, args.repeats, args.block_seconds)
    rows = [{"np": comm.size, "values": args.values, "contender": name,
             "median_us": 1e6 * seconds, "right": all(comm.allgather(checks[name]))}
            for name, seconds in medians.items()]  # fmt: skip
    if comm.rank == 0:
        for row in rows:
            mark = "" if row["right"] else "  ! wrong gradient"
            print(f"{row['np']} ranks, {row['contender']:20s} {row['median_us']:9.1f} µs{mark}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"benchmark": "collective_gradients", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
