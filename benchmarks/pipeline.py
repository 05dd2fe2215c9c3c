"""Pipeline parallelism: step time, bubble and activation memory of GPipe and 1F1B, and torch's.

`python benchmarks/pipeline.py --np 2,4` trains a deep MLP (`--depth` blocks of Linear(width,
width) + ReLU, then a Linear to 10 outputs) cut into `np` stages, one MPI job per (rank count,
contender); contenders:

    hvd    hvd.pipeline.Pipeline (MPI point-to-point through horovodlite)
    torch  torch.distributed.pipelining (PipelineStage, ScheduleGPipe / Schedule1F1B) on Gloo

Each job runs both schedules at every `--chunks` count, taking turns, `--repeats` times. Per
configuration it reports:

- step time: the slowest rank's, median over every timed step of every repeat;
- bubble: the fraction of a step a stage is idle (hvd only): 1 - busy / step, where step is the
  slowest rank's step time and busy is the stage's own step time less the time it spent in the
  Watch's waits for activations or gradients (`pipe.last_step["wait_s"]`); so a stage that
  finishes early is idle until the last one finishes. The median per stage, then the mean over
  stages, beside the theory (stages - 1) / (chunks + stages - 1);
- activation memory: per stage, the peak bytes of the tensors autograd keeps for backward
  (counted with torch.autograd.graph.saved_tensors_hooks, the parameters themselves excluded)
  during one extra step; the largest stage's, and stage 0's.

`--smoke` runs a tiny model at 2 ranks (the test suite's check that the script works).
Results go to benchmarks/results/pipeline.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from training_jobs import machine

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
MB = 2**20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", default="2,4", help="rank counts (= stages), comma-separated")
    parser.add_argument("--contenders", default="hvd,torch")
    parser.add_argument("--schedules", default="gpipe,1f1b")
    parser.add_argument("--chunks", default="1,2,4,8,16")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=16, help="Linear+ReLU blocks")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny model, 2 ranks, hvd only")
    parser.add_argument("--out", default=os.path.join(RESULTS, "pipeline.json"))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--contender", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.np, args.contenders, args.chunks = "2", "hvd", "1,4"
        args.width, args.depth, args.batch_size = 16, 4, 8
        args.steps, args.warmup, args.repeats = 2, 1, 1
    return args


# -- the worker: one MPI job, one contender ---------------------------------------------------


def build_model(args):
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(args.width, 10))
    return torch.nn.Sequential(*layers)


class SavedBytes:
    """The live and peak bytes of tensors saved for backward (parameters excluded)."""

    def __init__(self, params):
        self.params = {p.data_ptr() for p in params}
        self.live = self.peak = 0

    def hooks(self):
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda held: held.tensor)

    def pack(self, tensor):
        counted = 0 if tensor.data_ptr() in self.params else tensor.numel() * tensor.element_size()
        return _Held(self, tensor, counted)


class _Held:
    def __init__(self, counter, tensor, counted):
        self.counter, self.tensor, self.counted = counter, tensor, counted
        counter.live += counted
        counter.peak = max(counter.peak, counter.live)

    def __del__(self):
        self.counter.live -= self.counted


def hvd_runner(args, model, schedule: str, chunks: int):
    """Return (step(x, y) -> wait seconds or None, parameters) for horovodlite's pipeline."""
    import horovodlite.torch as hvd
    import torch

    pipe = hvd.pipeline.Pipeline(model, chunks=chunks, schedule=schedule)
    loss_fn = torch.nn.functional.cross_entropy

    def step(x, y):
        pipe.zero_grad()
        pipe.train_step(x, y, loss_fn)
        return pipe.last_step["wait_s"]

    return step, list(pipe.parameters())


def torch_runner(args, model, schedule: str, chunks: int):
    """Return (step, parameters) for torch.distributed.pipelining on the same stage split."""
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining

    from horovodlite.training.pipeline_schedule import balance_by_size, stage_bounds

    rank, size = dist.get_rank(), dist.get_world_size()
    layers = list(model.children())
    counts = balance_by_size([sum(p.numel() for p in m.parameters()) for m in layers], size)
    first, stop = stage_bounds(counts)[rank]
    part = torch.nn.Sequential(*layers[first:stop])
    stage = pipelining.PipelineStage(part, rank, size, torch.device("cpu"))
    kind = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[schedule]
    runner = kind(stage, n_microbatches=chunks, loss_fn=torch.nn.functional.cross_entropy)

    def step(x, y):
        part.zero_grad()
        if rank == 0:
            runner.step(x)
        elif rank == size - 1:
            runner.step(target=y, losses=[])
        else:
            runner.step()
        return None

    return step, list(part.parameters())


def worker(args) -> None:
    import horovodlite.torch as hvd
    import torch
    from mpi4py import MPI

    hvd.init()
    torch.set_num_threads(1)  # one core per rank at most; 4 ranks share 2 cores
    comm = MPI.COMM_WORLD
    if args.contender == "torch":
        import torch.distributed as dist

        port = comm.bcast(29500 + os.getpid() % 1000 if comm.rank == 0 else None)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=comm.rank, world_size=comm.size)  # fmt: skip
    make = hvd_runner if args.contender == "hvd" else torch_runner
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch_size, args.width, generator=generator)
    y = torch.randint(0, 10, (args.batch_size,), generator=generator)
    configs = [(s, int(c)) for s in args.schedules.split(",") for c in args.chunks.split(",")]
    measured = {config: {"times": [], "bubbles": [], "saved": 0} for config in configs}
    for repeat in range(args.repeats):
        shift = repeat % len(configs)  # rotate, so no configuration always runs first
        for schedule, chunks in configs[shift:] + configs[:shift]:
            try:
                step, params = make(args, build_model(args), schedule, chunks)
            except ValueError as e:  # torch's 1F1B refuses chunks < stages: every rank alike
                measured[schedule, chunks]["error"] = str(e)
                continue
            for _ in range(args.warmup):
                step(x, y)
            for _ in range(args.steps):
                comm.Barrier()
                start = time.perf_counter()
                waited = step(x, y)
                seconds = time.perf_counter() - start
                slowest = comm.allreduce(seconds, op=MPI.MAX)
                found = measured[schedule, chunks]
                found["times"].append(slowest)
                if waited is not None:  # idle: waiting inside the step, or done before the last
                    found["bubbles"].append(1 - (seconds - waited) / slowest)
            if repeat == 0:
                counter = SavedBytes(params)
                with counter.hooks():
                    step(x, y)
                measured[schedule, chunks]["saved"] = counter.peak
    rows = []
    for (schedule, chunks), found in measured.items():
        if "error" in found:
            if comm.rank == 0:
                rows.append({"np": comm.size, "contender": args.contender, "schedule": schedule,
                             "chunks": chunks, "error": found["error"]})  # fmt: skip
            continue
        bubbles = comm.gather(statistics.median(found["bubbles"]) if found["bubbles"] else None)
        saved = comm.gather(found["saved"])
        if comm.rank == 0:
            rows.append({
                "np": comm.size, "contender": args.contender, "schedule": schedule,
                "chunks": chunks, "median_ms": 1e3 * statistics.median(found["times"]),
                "steps": len(found["times"]),
                "bubble_per_stage": bubbles if bubbles[0] is not None else None,
                "bubble_theory": (comm.size - 1) / (chunks + comm.size - 1),
                "saved_mb_per_stage": [s / MB for s in saved],
            })  # fmt: skip
    if comm.rank == 0:
        parameters = sum(p.numel() for p in build_model(args).parameters())
        with open(args.worker, "w") as f:
            json.dump({"rows": rows, "parameters": parameters}, f)
    if args.contender == "torch":
        import torch.distributed as dist

        dist.destroy_process_group()


# -- the driver -------------------------------------------------------------------------------


def run_job(args, np: int, contender: str, part: str):
    from horovodlite.run.hosts import default_hosts
    from horovodlite.run.mpi_launcher import build_command, detect_flavour, find_mpiexec

    mpiexec = find_mpiexec()
    forwarded = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                 ("schedules", "chunks", "width", "depth", "batch_size", "steps", "warmup",
                  "repeats")]  # fmt: skip
    command = [sys.executable, "-m", "mpi4py", os.path.abspath(__file__), *forwarded,
               "--contender", contender, "--worker", part]  # fmt: skip
    argv = build_command(detect_flavour(mpiexec), mpiexec, np, default_hosts(np), command)
    result = subprocess.run(argv, timeout=1800, capture_output=True, text=True)
    if result.returncode != 0:
        return None, (result.stdout + result.stderr)[-3000:]
    with open(part) as f:
        found = json.load(f)
    os.remove(part)
    return found, None


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    load_before = os.getloadavg()
    rows, failures, parameters = [], {}, None
    for np in [int(n) for n in args.np.split(",")]:
        for contender in args.contenders.split(","):
            print(f"np {np}, {contender} ...", flush=True)
            found, error = run_job(args, np, contender, f"{args.out}.tmp")
            if error is not None:
                failures[f"np{np} {contender}"] = error
                print(f"np {np}, {contender} failed:\n{error}", flush=True)
                continue
            rows += found["rows"]
            parameters = found["parameters"]
    import torch

    report = {
        "benchmark": "pipeline",
        "command": " ".join(["python", "benchmarks/pipeline.py", *sys.argv[1:]]),
        "machine": machine(load_before, torch=torch.__version__),
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "out")},
        "parameters": parameters,
        "results": rows,
        "failures": failures,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(table(rows))
    print(f"step time: slowest rank, median ms; written to {args.out}")
    if failures and "hvd" in " ".join(failures):
        sys.exit(1)


def table(rows: list) -> str:
    header = ["np", "contender", "schedule", "chunks", "step ms", "bubble measured",
              "bubble theory", "saved act. MB max stage", "stage 0"]  # fmt: skip
    lines = [header, ["---"] * len(header)]
    for r in rows:
        if "error" in r:
            lines.append([str(r["np"]), r["contender"], r["schedule"], str(r["chunks"]),
                          "refused: " + r["error"][:60], "", "", "", ""])  # fmt: skip
            continue
        bubble = r["bubble_per_stage"]
        lines.append([
            str(r["np"]), r["contender"], r["schedule"], str(r["chunks"]),
            f"{r['median_ms']:.1f}",
            f"{sum(bubble) / len(bubble):.2f}" if bubble else "-",
            f"{r['bubble_theory']:.2f}",
            f"{max(r['saved_mb_per_stage']):.2f}", f"{r['saved_mb_per_stage'][0]:.2f}",
        ])  # fmt: skip
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


if __name__ == "__main__":
    main()
