"""The blocking grouped collectives: one agreement for a list of arrays.

    mpiexec -n 2 python benchmarks/grouped_calls.py               # prints a table
    mpiexec -n 2 python benchmarks/grouped_calls.py --out results/grouped_calls.json

In one MPI job, `--count` float32 arrays of each size (the same rows on every rank), op Sum for
the reduce-scatter and Average for the all-reduce, the contenders taking turns block by block
(each block starts after a barrier and keeps the slowest rank's mean; the median of `--repeats`
blocks):

    core grouped      horovodlite.grouped_allgather / grouped_reducescatter / grouped_allreduce
                      (absent before they existed: the contender is skipped)
    core via engine   synchronize(grouped_*_async(...)): the asynchronous form, waited for at once
    core one by one   one blocking allgather / reducescatter / allreduce per array
    mpi4py            MPI_Allgather / MPI_Reduce_scatter_block / MPI_Allreduce per array,
                      preallocated: the MPI library's floor (the all-reduce then divides)
    torch grouped     horovodlite.torch.grouped_allgather / grouped_reducescatter /
                      grouped_allreduce_ (in place: after the first call every rank holds the
                      mean, which stays the mean)
    jax jit grouped   horovodlite.jax's grouped form inside jax.jit (the allgather with `rows`)

The framework contenders run where torch or jax is installed. Every result is checked against
mpi4py's.
"""


import numpy as np
from mpi4py import MPI
from training_jobs import save_rows, timed_in_turns, turn_arguments

import horovodlite as hvd

KINDS = ("allgather", "reducescatter", "allreduce")
CONTENDERS = ("core grouped", "core via engine", "core one by one", "mpi4py", "torch grouped",
              "jax jit grouped")  # fmt: skip


def calls_for(kind: str, arrays: list, comm, results: dict) -> dict:
    """Return {contender: one call} for `kind` (one of KINDS) of `arrays`."""
    size = comm.size
    sync = getattr(hvd, f"grouped_{kind}", None)
    start = getattr(hvd, f"grouped_{kind}_async")
    single = getattr(hvd, kind)
    options = {"reducescatter": {"op": hvd.Sum}, "allreduce": {"op": hvd.Average}}.get(kind, {})
    calls = {}
    if sync is not None:
        calls["core grouped"] = lambda: results.__setitem__("core grouped", sync(arrays, **options))
    calls["core via engine"] = lambda: results.__setitem__(
        "core via engine", hvd.synchronize(start(arrays, name="g", **options)))
    calls["core one by one"] = lambda: results.__setitem__(
        "core one by one", [single(a, **options) for a in arrays])
    if kind == "allgather":
        outs = [np.empty((size * a.shape[0],), a.dtype) for a in arrays]
        mpi = [(a, out, comm.Allgather) for a, out in zip(arrays, outs)]
    elif kind == "allreduce":
        outs = [np.empty_like(a) for a in arrays]

        def mean(send, out):
            comm.Allreduce(send, out, op=MPI.SUM)
            out /= size

        mpi = [(a, out, mean) for a, out in zip(arrays, outs)]
    else:
        outs = [np.empty((a.shape[0] // size,), a.dtype) for a in arrays]
        mpi = [(a, out, lambda s, o: comm.Reduce_scatter_block(s, o, op=MPI.SUM))
               for a, out in zip(arrays, outs)]  # fmt: skip

    def mpi4py_calls():
        for send, out, call in mpi:
            call(send, out)
        results["mpi4py"] = outs

    calls["mpi4py"] = mpi4py_calls
    try:
        import horovodlite.torch as ht
        import torch

        tensors = [torch.from_numpy(a.copy()) for a in arrays]
        grouped = getattr(ht, "grouped_allreduce_" if kind == "allreduce" else f"grouped_{kind}")
        calls["torch grouped"] = lambda: results.__setitem__(
            "torch grouped", [t.numpy() for t in grouped(tensors, **options)])
    except ImportError:
        pass
    try:
        import horovodlite.jax as hj
        import jax
        import jax.numpy as jnp

        xs = [jnp.asarray(a) for a in arrays]
        if kind == "allgather":
            rows = [[a.shape[0]] * size for a in arrays]
            step = jax.jit(lambda *xs: hj.grouped_allgather(list(xs), rows=rows))
        elif kind == "allreduce":
            step = jax.jit(lambda *xs: hj.grouped_allreduce(list(xs), op=hj.Average))
        else:
            step = jax.jit(lambda *xs: hj.grouped_reducescatter(list(xs), op=hj.Sum))
        calls["jax jit grouped"] = lambda: results.__setitem__(
            "jax jit grouped", [np.asarray(r) for r in jax.block_until_ready(step(*xs))])
    except ImportError:
        pass
    return calls


def main() -> None:
    args = turn_arguments(__doc__.splitlines()[0], sizes="1024,65536,1048576", count=4,
                          block_seconds=0.1, unit="array")  # fmt: skip
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    rows = []
    for kind in KINDS:
        for nbytes in (int(s) for s in args.sizes.split(",")):
            values = max(comm.size, nbytes // 4 // comm.size * comm.size)  # divides evenly
            arrays = [np.arange(values, dtype=np.float32) % 7 + comm.rank + i
                      for i in range(args.count)]  # fmt: skip
            results = {}
            medians = timed_in_turns(comm, calls_for(kind, arrays, comm, results), args.repeats,
                            args.block_seconds)  # fmt: skip
            floor = results["mpi4py"]
            for name, seconds in medians.items():
                exact = all(np.allclose(np.asarray(r).reshape(-1), f, rtol=1e-6, atol=0)
                            for r, f in zip(results[name], floor))  # fmt: skip
                exact = all(comm.allgather(exact))
                rows.append({"np": comm.size, "collective": kind, "bytes": nbytes,
                             "count": args.count, "contender": name,
                             "median_us": 1e6 * seconds, "exact": exact})  # fmt: skip
    if comm.rank == 0:
        print(f"| ranks | collective | bytes x {args.count} | " + " | ".join(CONTENDERS) + " |")
        print("| --- " * (3 + len(CONTENDERS)) + "|")
        for kind in KINDS:
            for nbytes in (int(s) for s in args.sizes.split(",")):
                cells = {r["contender"]: r for r in rows
                         if r["collective"] == kind and r["bytes"] == nbytes}  # fmt: skip
                line = [f"{cells[c]['median_us']:,.1f}" + ("" if cells[c]["exact"] else " !")
                        if c in cells else "" for c in CONTENDERS]  # fmt: skip
                print(f"| {comm.size} | {kind} | {nbytes} | " + " | ".join(line) + " |")
        print("µs per grouped call, median of blocks, slowest rank (! = differs from mpi4py)")
        save_rows(args.out, "grouped_calls", rows)
    comm.Free()


if __name__ == "__main__":
    main()
