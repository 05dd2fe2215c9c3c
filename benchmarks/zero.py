"""Memory and step time of sharded optimizers: ZeroOptimizer against DistributedOptimizer and torch.

`python benchmarks/zero.py --np 2,4` trains an MLP (1024 -> 4096 -> 4096 -> 4096 -> 10, 37.8 M
parameters) with AdamW, one MPI job per (rank count, contender) so that each job's peak RSS is
its own; the jobs of a rank count take turns, `--repeats` times. It prints a table and writes
benchmarks/results/zero.json. Contenders:

    hvd         DistributedOptimizer: full gradients and full AdamW state on every rank
    zero1       ZeroOptimizer(stage=1): state sharded, gradients all-reduced in full
    zero2       ZeroOptimizer(stage=2): state and gradients sharded (reduce-scatter)
    torch-zero  torch's ZeroRedundancyOptimizer (state sharded) under DDP on Gloo

Memory per rank, counted from the tensors: parameters, gradients (distinct storages holding
gradients when step() runs: bucket views included) and optimizer state; and the process's peak
RSS. Step time: zero_grad, forward, backward, step; the slowest rank's, median over the steps.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from training_jobs import machine, slowest_rank

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CONTENDERS = ("hvd", "zero1", "zero2", "torch-zero")
MB = 2**20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", default="2,4", help="rank counts, comma-separated")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--width", type=int, default=4096, help="hidden width of the MLP")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per job")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per job")
    parser.add_argument("--repeats", type=int, default=2, help="jobs per (np, contender)")
    parser.add_argument("--out", default=os.path.join(RESULTS, "zero.json"))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--contender", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- the worker: one MPI job, one contender ---------------------------------------------------


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once)."""
    seen = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def state_tensors(optimizer) -> list:
    return [v for s in optimizer.state.values() for v in s.values() if hasattr(v, "numel")]


def worker(args) -> None:
    import horovodlite.torch as hvd
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from mpi4py import MPI
    from torch import nn

    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    hvd.init()
    contender = args.contender
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Linear(1024, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))  # fmt: skip
    forward = model
    if contender == "hvd":
        optimizer = hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4))
    elif contender in ("zero1", "zero2"):
        optimizer = hvd.ZeroOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4),
                                      stage=int(contender[-1]))  # fmt: skip
    else:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        store = None
        if comm.rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, comm.size, is_master=True, wait_for_workers=False)
        port = comm.bcast(store.port if comm.rank == 0 else None, root=0)
        if comm.rank != 0:
            store = dist.TCPStore("127.0.0.1", port, comm.size, is_master=False)
        dist.init_process_group("gloo", store=store, rank=comm.rank, world_size=comm.size)
        forward = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-4)
    generator = torch.Generator().manual_seed(comm.rank)
    x = torch.randn(args.batch_size, 1024, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    grad_bytes = [0]

    def step(measure=False):
        optimizer.zero_grad()
        F.cross_entropy(forward(x), y).backward()
        if measure:  # the gradients that step() will use, once reduced
            if hasattr(optimizer, "synchronize"):
                optimizer.synchronize()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            grads += [s.grad for s in getattr(optimizer, "_zero_shard", {}).values()
                      if s.grad is not None]  # fmt: skip
            grad_bytes[0] = storage_bytes(grads)
            if hasattr(optimizer, "skip_synchronize"):
                with optimizer.skip_synchronize():
                    optimizer.step()
                return
        optimizer.step()

    for _ in range(args.warmup):
        step()
    comm.Barrier()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    times = slowest_rank(comm, times)
    step(measure=True)
    local = optimizer.optim if contender == "torch-zero" else optimizer
    memory = {
        "parameters_mb": storage_bytes(model.parameters()) / MB,
        "gradients_mb": grad_bytes[0] / MB,
        "state_mb": sum(t.numel() * t.element_size() for t in state_tensors(local)) / MB,
        # ru_maxrss is in KiB on Linux.
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    worst = {k: max(comm.allgather(v)) for k, v in memory.items()}  # the largest rank's
    if comm.rank == 0:
        with open(args.worker, "w") as f:
            json.dump({"np": comm.size, "contender": contender, "times": times, **worst,
                       "parameters": sum(p.numel() for p in model.parameters())}, f)  # fmt: skip
    if dist.is_initialized():
        dist.destroy_process_group()


# -- the driver -------------------------------------------------------------------------------


def run_job(args, np: int, contender: str, part: str) -> dict:
    from horovodlite.run.hosts import default_hosts
    from horovodlite.run.mpi_launcher import build_command, detect_flavour, find_mpiexec

    mpiexec = find_mpiexec()
    forwarded = [f"--width={args.width}", f"--batch-size={args.batch_size}",
                 f"--steps={args.steps}", f"--warmup={args.warmup}"]  # fmt: skip
    command = [sys.executable, "-m", "mpi4py", os.path.abspath(__file__), *forwarded,
               "--contender", contender, "--worker", part]  # fmt: skip
    argv = build_command(detect_flavour(mpiexec), mpiexec, np, default_hosts(np), command)
    subprocess.run(argv, check=True, timeout=1800)
    with open(part) as f:
        result = json.load(f)
    os.remove(part)
    return result


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    load_before = os.getloadavg()
    contenders = args.contenders.split(",")
    jobs = []
    for np in [int(n) for n in args.np.split(",")]:
        for repeat in range(args.repeats):
            shift = repeat % len(contenders)  # rotate, so no contender always runs first
            for contender in contenders[shift:] + contenders[:shift]:
                print(f"np {np}, {contender}, run {repeat + 1} ...", flush=True)
                jobs.append(run_job(args, np, contender, f"{args.out}.tmp"))
    rows = []
    for np in sorted({j["np"] for j in jobs}):
        for contender in contenders:
            mine = [j for j in jobs if j["np"] == np and j["contender"] == contender]
            times = sorted(t for j in mine for t in j["times"])
            row = {"np": np, "contender": contender, "parameters": mine[0]["parameters"],
                   "median_ms": 1e3 * statistics.median(times),
                   "p10_ms": 1e3 * times[len(times) // 10],
                   "p90_ms": 1e3 * times[(9 * len(times)) // 10], "steps": len(times)}  # fmt: skip
            for key in ("parameters_mb", "gradients_mb", "state_mb", "peak_rss_mb"):
                row[key] = max(j[key] for j in mine)
            rows.append(row)
    import torch

    report = {
        "benchmark": "zero",
        "command": " ".join(["python", "benchmarks/zero.py", *sys.argv[1:]]),
        "machine": machine(load_before, torch=torch.__version__),
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "out")},
        "results": rows,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(table(rows))
    print(f"per rank (the largest rank's); step time median ms; written to {args.out}")


def table(rows: list) -> str:
    header = ["np", "contender", "step ms (p10-p90)", "x hvd", "params MB", "grads MB",
              "state MB", "grads+state vs hvd", "peak RSS MB"]  # fmt: skip
    lines = [header, ["---"] * len(header)]
    base = {r["np"]: r for r in rows if r["contender"] == "hvd"}
    for r in rows:
        ref = base.get(r["np"])
        held = r["gradients_mb"] + r["state_mb"]
        lines.append([
            str(r["np"]), r["contender"],
            f"{r['median_ms']:.0f} ({r['p10_ms']:.0f}-{r['p90_ms']:.0f})",
            f"{r['median_ms'] / ref['median_ms']:.2f}" if ref else "",
            f"{r['parameters_mb']:.0f}", f"{r['gradients_mb']:.0f}", f"{r['state_mb']:.0f}",
            f"{held / (ref['gradients_mb'] + ref['state_mb']):.2f}" if ref else "",
            f"{r['peak_rss_mb']:.0f}",
        ])  # fmt: skip
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


if __name__ == "__main__":
    main()
