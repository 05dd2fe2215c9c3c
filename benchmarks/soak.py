"""Soak: many mixed collectives, then the torch training loop, watching what a leak would grow.

Two ranks run `--collectives` mixed collectives (sync and async all-reduces of several sizes,
grouped all-reduces, all-gathers, broadcasts, all-to-alls, reduce-scatters, barriers), then the
torch DistributedOptimizer loop on a small model for `--minutes`. Every `--every` seconds each
rank samples its resident memory, open file descriptors, threads, and the requests horovodlite
holds (the engine's pending and in-flight requests and the notes still being sent). Rank 0
writes the samples (JSON) and plots them.

    python benchmarks/soak.py --collectives 100000 --minutes 30 \
        --out benchmarks/results/soak.json --plot docs/img/soak.png
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.abspath(__file__)


def sample(phase: str, done: int, start: float) -> dict:
    """Return this process's resources now."""
    import horovodlite as hvd

    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    state = hvd.state.current()
    engine = state.engine
    with engine._lock:
        held = len(engine._pending) + len(engine._incoming) + len(engine._in_flight)
    notes = len(state.watch._inbox._sends) + len(engine._wakeup._inbox._sends)
    return {
        "phase": phase,
        "done": done,
        "seconds": round(time.monotonic() - start, 2),
        "rss_mib": round(rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 2),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "requests": held,
        "notes": notes,
    }


def collectives(hvd, count: int, every: float, start: float, samples: list) -> None:
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(25)  # the same sequence on every rank
    kinds = ["allreduce", "async", "grouped", "allgather", "broadcast", "alltoall",
             "reducescatter", "barrier"]  # fmt: skip
    last, done = 0.0, 0
    while done < count:
        kind = kinds[int(rng.integers(len(kinds)))]
        n = int(rng.choice([1, 16, 1024, 65536]))
        x = np.full(n, float(rank + 1))
        if kind == "allreduce":
            out = hvd.allreduce(x, op=hvd.Sum, name=f"a{n}")
            assert out[0] == size * (size + 1) / 2
            done += 1
        elif kind == "async":
            handles = [hvd.allreduce_async(x, op=hvd.Sum, name=f"b{n}.{i}") for i in range(8)]
            for handle in handles:
                assert hvd.synchronize(handle)[0] == size * (size + 1) / 2
            done += 8
        elif kind == "grouped":
            hvd.grouped_allreduce([x, x[:1]], op=hvd.Sum, name=f"g{n}")
            done += 1
        elif kind == "allgather":
            assert hvd.allgather(np.ones(16), name="ag").shape[0] == 16 * size
            done += 1
        elif kind == "broadcast":
            assert hvd.broadcast(x, root_rank=0, name=f"bc{n}")[0] == 1.0
            done += 1
        elif kind == "alltoall":
            hvd.alltoall(np.zeros((size, 4)) + rank, name="aa")
            done += 1
        elif kind == "reducescatter":
            hvd.reducescatter(np.ones((size * 4, 2)), op=hvd.Sum, name="rs")
            done += 1
        else:
            hvd.barrier()
            done += 1
        if time.monotonic() - last > every:
            last = time.monotonic()
            samples.append(sample("collectives", done, start))


def training(minutes: float, every: float, start: float, samples: list) -> None:
    import torch  # noqa: I001 - the framework first, then its binding

    import horovodlite.torch as hvt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    hvt.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    generator = torch.Generator().manual_seed(hvt.rank())
    end, last, steps = time.monotonic() + 60 * minutes, 0.0, 0
    while True:
        # Every rank takes the same decision to stop: the deadline of rank 0.
        if steps % 50 == 0 and hvt.broadcast_object(time.monotonic() > end, root_rank=0):
            break
        x, y = torch.randn(64, 32, generator=generator), torch.randn(64, 1, generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        steps += 1
        if time.monotonic() - last > every:
            last = time.monotonic()
            samples.append(sample("training", steps, start))


def worker(args) -> None:
    import horovodlite as hvd

    if args.minutes > 0:
        import horovodlite.torch  # noqa: F401 - imported before the clock starts
    hvd.init()
    start, samples = time.monotonic(), []
    samples.append(sample("start", 0, start))
    collectives(hvd, args.collectives, args.every, start, samples)
    samples.append(sample("collectives", args.collectives, start))
    if args.minutes > 0:
        training(args.minutes, args.every, start, samples)
    everyone = hvd.allgather_object(samples)
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"collectives": args.collectives, "minutes": args.minutes,
                       "ranks": everyone}, f, indent=1)  # fmt: skip
    hvd.shutdown()


def plot(path: str, image: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        data = json.load(f)
    metrics = [("rss_mib", "resident memory, MiB"), ("fds", "open file descriptors"),
               ("threads", "threads"), ("requests", "requests held + notes in flight")]  # fmt: skip
    figure, axes = plt.subplots(len(metrics), 1, figsize=(8, 9), sharex=True)
    for rank, samples in enumerate(data["ranks"]):
        t = [s["seconds"] / 60 for s in samples]
        for ax, (key, label) in zip(axes, metrics):
            values = [s[key] + (s["notes"] if key == "requests" else 0) for s in samples]
            ax.plot(t, values, label=f"rank {rank}")
            ax.set_ylabel(label, fontsize=8)
    switch = next((s["seconds"] / 60 for s in data["ranks"][0] if s["phase"] == "training"), None)
    for ax in axes:
        if switch is not None:
            ax.axvline(switch, color="grey", linestyle=":")
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{data['collectives']} mixed collectives, then the torch training loop "
                      f"({data['minutes']:g} min), 2 ranks", fontsize=9)  # fmt: skip
    axes[-1].set_xlabel("minutes")
    figure.tight_layout()
    figure.savefig(image, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--collectives", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=30.0, help="of the training loop")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--out", default="soak.json")
    parser.add_argument("--plot", help="write the plot here (PNG)")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    argv = [sys.executable, "-m", "horovodlite.run", "-np", "2", sys.executable, HERE, "--worker",
            "--collectives", str(args.collectives), "--minutes", str(args.minutes),
            "--every", str(args.every), "--out", os.path.abspath(args.out)]  # fmt: skip
    subprocess.run(argv, check=True)
    if args.plot:
        plot(args.out, args.plot)
    with open(args.out) as f:
        for rank, samples in enumerate(json.load(f)["ranks"]):
            first, last = samples[1], samples[-1]
            print(f"rank {rank}: " + ", ".join(
                f"{k} {first[k]} -> {last[k]}" for k in ("rss_mib", "fds", "threads", "requests")
            ))  # fmt: skip


if __name__ == "__main__":
    main()
