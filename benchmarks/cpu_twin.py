"""The CPU twin of the GPU step: hvd.allreduce of CPU torch tensors over Gloo, beside Gloo's own.

    python benchmarks/cpu_twin.py --np 2            # launches the job, prints the table
    mpiexec -n 2 python benchmarks/cpu_twin.py --worker

With HOROVODLITE_TRANSPORT=gloo horovodlite moves the data of a CPU torch tensor through a
torch.distributed Gloo group: the very code that moves a CUDA tensor through NCCL, with only the
backend different (docs/gpu.md). Contenders, taking turns size by size in one job:

  hvd              hvd.allreduce(t, op=Sum): the agreement over MPI, then Gloo; a new tensor
  gloo             torch.distributed.all_reduce on a clone of t (the result is a new tensor, as
                   horovodlite's), on a process group of torch's own
  gloo-after-sync  the same, each call after an MPI barrier: what Gloo costs when every rank
                   enters it at once, as every rank leaves a metadata agreement
  floor            horovodlite's own Gloo group reducing a copy, no agreement: the data path
                   alone

Each block times `iterations` back-to-back calls after a barrier; the slowest rank's mean per
call counts; the median over `--repeats` blocks is reported.

Gloo's own call varies from block to block by more than the difference the target asks about
(50 µs at 1 KiB), so `--pairs N` also times N rounds of single calls, each after an MPI barrier,
in turns (the order alternates): `hvd`, `gloo-after-sync`, and Gloo's own call on the very group
horovodlite moves the data on (`pg.allreduce` of a clone: torch's API, none of horovodlite's
code). The difference within each round (the slowest rank's time of each) cancels what drifts
between rounds. Two Gloo groups of one job can differ by more than that, one group slower than
the other by up to 1 ms at 1 KiB in some jobs (docs/benchmarks.md), so the difference on the same
group is horovodlite's own cost; the one against torch's group is what the issue's target names.
Each median difference is reported with a 95% bootstrap interval of that median.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20]
CONTENDERS = ["hvd", "gloo", "gloo-after-sync", "floor"]


def _worker(args) -> None:
    os.environ["HOROVODLITE_TRANSPORT"] = "gloo"
    import horovodlite.torch as hvd
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from horovodlite.ops import ReduceOp
    from horovodlite.state import current
    from horovodlite.transport import select

    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    port = comm.bcast(29000 + os.getpid() % 1000 if rank == 0 else None, root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    state = current()
    transport = select(state.settings, np, ReduceOp.SUM, np.dtype(np.float32))

    def calls(name, tensor, array):
        if name == "hvd":
            return lambda: hvd.allreduce(tensor, op=hvd.Sum)
        if name == "gloo":
            return lambda: dist.all_reduce(tensor.clone())
        if name == "gloo-after-sync":
            return lambda: (comm.Barrier(), dist.all_reduce(tensor.clone()))
        return lambda: transport.allreduce(state.comm, array.copy(), ReduceOp.SUM, np, "gloo")

    def block(call, iterations: int) -> float:
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            call()
        return comm.allreduce((time.perf_counter() - start) / iterations, op=MPI.MAX)

    def paired(tensor, count: int) -> tuple:
        """Return `count` differences each: hvd's call minus Gloo's on torch's group, and minus
        Gloo's on horovodlite's own group, every call after a barrier (seconds)."""
        hvd.allreduce(tensor, op=hvd.Sum)  # (horovodlite builds its group on first use)
        same_group = transport.group(state.comm).backend
        calls = (
            lambda: hvd.allreduce(tensor, op=hvd.Sum),
            lambda: dist.all_reduce(tensor.clone()),
            lambda: same_group.allreduce([tensor.clone()]).wait(),
        )
        slowest = paired_rounds(comm, calls, count)
        return (slowest[:, 0] - slowest[:, 1]).tolist(), (slowest[:, 0] - slowest[:, 2]).tolist()

    results = []
    for nbytes in args.sizes:
        tensor = torch.ones(nbytes // 4)
        array = tensor.numpy()
        # About `time_per_block` seconds a block, from a first guess of 2 ms a MiB plus 1 ms.
        guess = 1e-3 + 2e-3 * nbytes / (1 << 20)
        iterations = max(3, min(2000, int(args.time_per_block / guess)))
        times = {name: [] for name in CONTENDERS}
        for name in CONTENDERS:
            block(calls(name, tensor, array), max(1, iterations // 10))  # warm-up
        for _ in range(args.repeats):
            for name in CONTENDERS:
                times[name].append(block(calls(name, tensor, array), iterations))
        row = {"bytes": nbytes, "iterations": iterations}
        row.update({name: statistics.median(values) for name, values in times.items()})
        if args.pairs:
            row["differences"], row["differences_same_group"] = paired(tensor, args.pairs)
        results.append(row)
    if rank == 0:
        with open(args.output, "w") as f:
            json.dump({"np": size, "results": results}, f, indent=1)
    dist.destroy_process_group()


def paired_rounds(comm, calls: tuple, count: int):
    """Time `count` rounds of `calls`, each call after a barrier, in turns (the order alternates
    from round to round); return the slowest rank's seconds, an array (count, len(calls)).
    Collective on `comm` (mpi4py)."""
    import numpy as np
    from mpi4py import MPI

    own = np.empty((count, len(calls)))
    for i in range(count):
        for k in range(len(calls)) if i % 2 == 0 else reversed(range(len(calls))):
            comm.Barrier()
            start = time.perf_counter()
            calls[k]()
            own[i, k] = time.perf_counter() - start
    slowest = np.empty_like(own)
    comm.Allreduce(own, slowest, op=MPI.MAX)
    return slowest


def table(data: dict) -> str:
    lines = [
        f"{data['np']} ranks, median time per call (µs); hvd - gloo and hvd / gloo",
        f"{'bytes':>10} {'hvd':>9} {'gloo':>9} {'after-sync':>11} {'floor':>9} "
        f"{'hvd-gloo':>9} {'hvd/gloo':>9}",
    ]
    for row in data["results"]:
        us = {name: row[name] * 1e6 for name in CONTENDERS}
        lines.append(
            f"{row['bytes']:>10} {us['hvd']:>9.1f} {us['gloo']:>9.1f} "
            f"{us['gloo-after-sync']:>11.1f} {us['floor']:>9.1f} "
            f"{us['hvd'] - us['gloo']:>9.1f} {us['hvd'] / us['gloo']:>9.3f}"
        )
    against = {"differences": "gloo-after-sync", "differences_same_group": "gloo on hvd's group"}
    for row in data["results"]:
        for key, other in against.items():
            if key not in row:
                continue
            median, low, high = _median_interval(row[key])
            lines.append(
                f"{row['bytes']:>10} bytes: hvd - {other}, {len(row[key])} rounds: median "
                f"{median * 1e6:.1f} µs (95% interval {low * 1e6:.1f} to {high * 1e6:.1f})"
            )
    return "\n".join(lines)


def _median_interval(values: list, resamples: int = 2000) -> tuple:
    """Return the median of `values` and a 95% bootstrap interval of it."""
    import numpy as np

    values = np.asarray(values)
    draws = np.random.default_rng(0).choice(values, (resamples, values.size))
    medians = np.median(draws, axis=1)
    return float(np.median(values)), *np.percentile(medians, [2.5, 97.5]).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help="run inside an MPI job")
    parser.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=SIZES)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--time-per-block", type=float, default=0.3)
    parser.add_argument("--pairs", type=int, default=0, help="paired single calls per size")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "cpu_twin.json"))
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from mpirun import mpiexec_argv

    command = [*mpiexec_argv(args.np), sys.executable, os.path.abspath(__file__), "--worker",
               "--sizes", ",".join(map(str, args.sizes)), "--repeats", str(args.repeats),
               "--time-per-block", str(args.time_per_block), "--pairs", str(args.pairs),
               "--output", args.output]  # fmt: skip
    subprocess.run(command, check=True, timeout=1800)
    with open(args.output) as f:
        print(table(json.load(f)))


if __name__ == "__main__":
    main()
