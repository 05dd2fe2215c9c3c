"""Parameter servers against a straggler: time to a target on digits, server throughput, rows.

`python benchmarks/ps_straggler.py` runs one MPI job per (server count, mode, workers, repeat):

    allreduce  hvd.DistributedOptimizer on W ranks (synchronous ring all-reduce)
    sync       hvd.ps, staleness=0 (synchronous through the servers)
    bounded    hvd.ps, staleness=2
    async      hvd.ps, staleness=None

where the hvd.ps modes run `--np` ranks of which S serve (each S of `--servers`), so W = np - S
ranks train in every mode, twice: equal workers, and the last worker slowed 2x. Every worker's
step runs a real MLP step on digits plus a simulated compute of `--compute-ms` (a sleep); the
slow worker sleeps twice that.

Like for like: the same W training processes in every mode, the same batch per worker step,
the same number of steps per worker (so the same samples processed), and the same learning rate
per sample. A synchronous step (allreduce, sync) applies the mean of W gradients with `--lr`;
bounded and async apply each worker's gradient as its own update with `--lr` / W, so that once
every worker has pushed once the parameters moved as far as one synchronous step would have
(up to staleness). Only wall-clock time separates the modes: who waits for whom.

Worker 0 (never the slow one) evaluates its current parameters on the held-out digits every
`--eval-every` steps; the time to a target is the first evaluation at or past it (test loss <=
`--target-loss` and accuracy >= `--target-accuracy`). The hvd.ps runs also give the servers'
pushes/s and bytes/s and the staleness histogram.

`--embedding` also trains an embedding-heavy model (nn.Embedding(1e6, 16, sparse=True) on
random ids) asynchronously and reports the bytes each step moved against a dense exchange of
the whole model; `--link` measures the MPI link between two ranks (point-to-point send/recv
against a one-sided MPI_Get of the same shard): the reason the servers use point-to-point.

The machine is shared: every configuration runs `--repeats` times and medians are reported.
Results: benchmarks/results/ps_straggler.json; plot: docs/img/ps.png; `uptime` before and after.
"""

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
MODES = ("allreduce", "sync", "bounded", "async")
STALENESS = {"sync": 0, "bounded": 2, "async": None}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--servers", default="1", help="server counts to run, e.g. 1,2")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=32, help="rows per worker step")
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--compute-ms", type=float, default=100.0)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--target-loss", type=float, default=0.5)
    parser.add_argument("--target-accuracy", type=float, default=0.87)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default="equal,slow", help="equal workers, one 2x slower")
    parser.add_argument("--embedding", action="store_true")
    parser.add_argument("--link", action="store_true")
    parser.add_argument("--output", default=os.path.join(RESULTS, "ps_straggler.json"))
    parser.add_argument("--plot", default=os.path.join(HERE, "..", "docs", "img", "ps.png"))
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="combine these results files (e.g. one per server count, run side "
                        "by side) into --output and plot them; runs nothing")  # fmt: skip
    parser.add_argument("--job", default=None, help=argparse.SUPPRESS)  # inside mpiexec
    parser.add_argument("--slow", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- inside the MPI job -----------------------------------------------------------------------


def digits():
    import torch
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    return x[:1400], torch.tensor(y[:1400]), x[1400:], torch.tensor(y[1400:])


def train_job(args) -> None:
    import horovodlite.torch as hvd
    import torch

    hvd.init()
    F = torch.nn.functional
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    x, y, x_test, y_test = digits()
    mode, size, servers = args.job, hvd.size(), int(args.servers)
    job = opt = None
    if mode == "allreduce":  # run on the W ranks that train
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=args.lr),
                                       named_parameters=net.named_parameters())  # fmt: skip
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        workers = size
    else:
        workers = size - servers
        # A synchronous step averages W gradients; an update of one worker's gradient moves
        # 1/W as far, so W of them move as far as one synchronous step (see the docstring).
        lr = args.lr if mode == "sync" else args.lr / workers
        sgd = functools.partial(torch.optim.SGD, lr=lr)
        job = hvd.ps.start(net, sgd, servers=servers, staleness=STALENESS[mode])
        if job.is_server:
            job.serve()  # its report reaches the workers with the final parameters
            return
    rank, slow = hvd.rank(), args.slow and hvd.rank() == workers - 1
    generator = torch.Generator().manual_seed(rank)
    curve, start = [], time.perf_counter()
    for step in range(args.steps):
        rows = torch.randint(0, len(x), (args.batch_size,), generator=generator)
        loss = F.cross_entropy(net(x[rows]), y[rows])
        loss.backward()
        time.sleep(args.compute_ms * (2 if slow else 1) / 1000)  # the simulated compute
        if opt is not None:
            opt.step()
            opt.zero_grad()
        else:
            job.push()
        if rank == 0 and step % args.eval_every == args.eval_every - 1:
            with torch.no_grad():
                if job is not None:
                    job.pull()  # the parameters this worker's next step uses
                out = net(x_test)
                test_loss = F.cross_entropy(out, y_test).item()
                accuracy = (out.argmax(1) == y_test).float().mean().item()
            curve.append((time.perf_counter() - start, step + 1, test_loss, accuracy))
    seconds = time.perf_counter() - start
    report = job.finish() if job is not None else None
    if rank == 0:
        print("WORKER " + json.dumps({"curve": curve, "seconds": seconds, "report": report}),
              flush=True)  # fmt: skip


def embedding_job(args) -> None:
    import horovodlite.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rows, dim = 1_000_000, 16
    net = torch.nn.Sequential(torch.nn.Embedding(rows, dim, sparse=True), torch.nn.Flatten(),
                              torch.nn.Linear(4 * dim, 2))  # fmt: skip
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    job = hvd.ps.start(net, sgd, servers=int(args.servers), staleness=None)
    if job.is_server:
        job.serve()
        return
    generator = torch.Generator().manual_seed(hvd.rank())
    steps, start = 50, time.perf_counter()
    for _ in range(steps):
        ids = torch.randint(0, rows, (args.batch_size, 4), generator=generator)
        torch.nn.functional.cross_entropy(net(ids), ids[:, 0] % 2).backward()
        job.push()
    seconds = time.perf_counter() - start
    moved = job.client.bytes_sent + job.client.bytes_received  # before the final parameters
    report = job.finish()
    if hvd.rank() == 0:
        model_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
        print("EMBEDDING " + json.dumps({
            "rows": rows, "dim": dim, "steps": steps, "seconds": seconds,
            "worker_bytes_per_step": moved / steps,
            "dense_bytes_per_step": 2 * model_bytes,  # pull and push of the whole model
            "server_bytes_moved": report["bytes_moved"], "pushes_per_s": report["pushes_per_s"],
        }), flush=True)  # fmt: skip


def link_job(args) -> None:
    """Rank 0 fetches a 1 MiB shard from rank 1: point-to-point against one-sided MPI_Get."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    shard, repeats = np.ones(2**18, np.float32), 200
    results = {}
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(repeats):  # a pull: a request, then the shard back
        if comm.rank == 0:
            comm.Send(np.zeros(1, np.int64), 1, 1)
            comm.Recv(shard, 1, 2)
        elif comm.rank == 1:
            comm.Recv(np.zeros(1, np.int64), 0, 1)
            comm.Send(shard, 0, 2)
    results["p2p_pull_us"] = (time.perf_counter() - start) / repeats * 1e6
    window = MPI.Win.Create(shard if comm.rank == 1 else np.empty(0, np.float32), comm=comm)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(repeats):  # the same pull as a passive-target Get under a shared lock
        if comm.rank == 0:
            window.Lock(1, MPI.LOCK_SHARED)
            window.Get(shard, 1)
            window.Unlock(1)
    comm.Barrier()
    results["get_pull_us"] = (time.perf_counter() - start) / repeats * 1e6
    window.Free()
    if comm.rank == 0:
        results["shard_bytes"] = shard.nbytes
        results["p2p_gbytes_per_s"] = shard.nbytes / results["p2p_pull_us"] / 1e3
        results["get_gbytes_per_s"] = shard.nbytes / results["get_pull_us"] / 1e3
        print("LINK " + json.dumps(results), flush=True)


# -- the driver -------------------------------------------------------------------------------


def launch(args, job: str, slow=False, np=None, servers=1) -> list:
    argv = ["mpiexec", "-n", str(np or args.np), sys.executable, os.path.abspath(__file__),
            "--job", job, "--servers", str(servers), "--steps", str(args.steps),
            "--batch-size", str(args.batch_size), "--lr", str(args.lr),
            "--compute-ms", str(args.compute_ms), "--eval-every", str(args.eval_every)]  # fmt: skip
    argv += ["--slow"] if slow else []
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out.stdout.splitlines()


def tagged(lines: list, tag: str):
    """The JSON object after `tag` (another rank's output may follow it on the line)."""
    line = next(line for line in lines if line.startswith(tag))
    return json.JSONDecoder().raw_decode(line[len(tag) :])[0]


def time_to_target(curve, args):
    for seconds, step, loss, accuracy in curve:
        if loss <= args.target_loss and accuracy >= args.target_accuracy:
            return seconds, step
    return None, None


def run_mode(args, mode: str, slow: bool, servers: int) -> dict:
    runs = []
    workers = args.np - servers
    for _ in range(args.repeats):
        np = workers if mode == "allreduce" else args.np
        lines = launch(args, mode, slow, np=np, servers=servers)
        worker = tagged(lines, "WORKER ")
        reports = worker["report"]["servers"] if worker["report"] else []
        seconds, step = time_to_target(worker["curve"], args)
        runs.append({"time_to_target_s": seconds, "steps_to_target": step,
                     "run_s": worker["seconds"], "final": worker["curve"][-1],
                     "curve": worker["curve"], "servers": reports})  # fmt: skip
    reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]

    def med(key):
        return (
            statistics.median(s[key] for r in runs for s in r["servers"])
            if runs[0]["servers"]
            else None
        )

    everyone = len(reached) == len(runs)
    return {
        # servers: the comparison this run belongs to (allreduce itself runs on the W workers)
        "mode": mode, "servers": servers, "workers": workers,
        "slow_worker": slow, "runs": runs,
        "median_time_to_target_s": statistics.median(reached) if everyone else None,
        "reached": f"{len(reached)}/{len(runs)}",
        "median_run_s": statistics.median(r["run_s"] for r in runs),
        "median_final_accuracy": statistics.median(r["final"][3] for r in runs),
        "median_server_pushes_per_s": med("pushes_per_s"),
        "median_server_bytes_per_s": med("bytes_per_s"),
        "median_staleness_mean": med("staleness_mean"),
        "median_staleness_max": med("staleness_max"),
    }  # fmt: skip


def plot(results: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({r["servers"] for r in results})
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.8 * len(groups)), squeeze=False)
    for (bars, curves), servers in zip(axes, groups):
        chosen = [r for r in results if r["servers"] == servers]
        workers = chosen[0]["workers"]
        modes = [m for m in MODES if any(r["mode"] == m for r in chosen)]
        for k, slow in enumerate((False, True)):
            times = {r["mode"]: r["median_time_to_target_s"] or 0 for r in chosen
                     if r["slow_worker"] == slow}  # fmt: skip
            label = "one worker 2x slower" if slow else "equal workers"
            bars.bar([i + 0.4 * k for i in range(len(modes))], [times.get(m, 0) for m in modes],
                     width=0.4, label=label)  # fmt: skip
        bars.set_xticks([i + 0.2 for i in range(len(modes))], modes)
        bars.set_ylabel("seconds to target (median)")
        bars.set_title(f"{workers} workers, {servers} server(s) (allreduce: {workers} ranks)")
        bars.legend()
        for r in chosen:
            if r["slow_worker"]:
                run = r["runs"][0]
                curves.plot([c[0] for c in run["curve"]], [c[2] for c in run["curve"]],
                            label=r["mode"])  # fmt: skip
        curves.set_xlabel("seconds")
        curves.set_ylabel("test loss (worker 0)")
        curves.set_title("one worker 2x slower (first run)")
        curves.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def merge(args) -> None:
    parts = []
    for path in args.merge:
        with open(path) as f:
            parts.append(json.load(f))
    keep = ("settings", "uptime_before", "uptime_after", "load_average_1min_before_after")
    output = {"parts": [{k: part.get(k) for k in keep} for part in parts],
              "results": [r for part in parts for r in part["results"]]}  # fmt: skip
    for key in ("embedding", "link"):
        found = [part[key] for part in parts if key in part]
        if found:
            output[key] = found[0]
    with open(args.output, "w") as f:
        json.dump(output, f, indent=1)
    if args.plot:
        plot(output["results"], args.plot)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.merge:
        return merge(args)
    if args.job == "embedding":
        return embedding_job(args)
    if args.job == "link":
        return link_job(args)
    if args.job:
        return train_job(args)
    load = os.getloadavg()
    output = {"settings": {k: v for k, v in vars(args).items() if k not in ("job", "slow")},
              "uptime_before": uptime(), "results": []}  # fmt: skip
    print(output["uptime_before"], flush=True)
    for servers in [int(n) for n in args.servers.split(",")]:
        for slow in [case == "slow" for case in args.cases.split(",")]:
            for mode in args.modes.split(","):
                result = run_mode(args, mode, slow, servers)
                output["results"].append(result)
                print(json.dumps({k: v for k, v in result.items() if k != "runs"}), flush=True)
    if args.embedding:
        lines = launch(args, "embedding", servers=int(args.servers.split(",")[0]))
        output["embedding"] = tagged(lines, "EMBEDDING ")
        print(output["embedding"], flush=True)
    if args.link:
        lines = launch(args, "link", np=2)
        output["link"] = tagged(lines, "LINK ")
        print(output["link"], flush=True)
    output["load_average_1min_before_after"] = [load[0], os.getloadavg()[0]]
    output["uptime_after"] = uptime()
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(output, f, indent=1)
    if args.plot:
        plot(output["results"], args.plot)


if __name__ == "__main__":
    main()
