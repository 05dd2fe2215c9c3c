"""What the benchmarks share: the training-step ones' jobs (torch_ddp.py, keras_fit.py, ...) and
the timing of calls in turns inside one job (grouped_calls.py, collective_gradients.py).

The driver runs the benchmark script once per rank count under the installed mpiexec (the
script's worker writes its results to a JSON file named by `--worker`); inside a job the step
time that counts is the slowest rank's; the report records the machine and its load.
"""

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time


def argument_parser(doc: str, contenders: tuple, out: str) -> argparse.ArgumentParser:
    """The options both benchmarks take; each adds its own --threads."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--np", default="2,4", help="rank counts, comma-separated")
    parser.add_argument("--models", default="cnn,mlp")
    parser.add_argument("--contenders", default=",".join(contenders))
    parser.add_argument("--rounds", type=int, default=8, help="blocks per contender")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per block")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before each block")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--mlp-width", type=int, default=4096)
    parser.add_argument("--out", default=out)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser


def run_jobs(script: str, counts: list, forwarded: list, out: str, timeout: float) -> list:
    """Run `script ... --worker PART` on each rank count; return the jobs' JSON, in order."""
    jobs = []
    for np in counts:
        part = f"{out}.np{np}.tmp"
        command = [sys.executable, "-m", "mpi4py", os.path.abspath(script), *forwarded]
        print(f"running {np} rank(s) ...", flush=True)
        run_job(np, command + ["--worker", part], timeout, capture=False)
        with open(part) as f:
            jobs.append(json.load(f))
        os.remove(part)
    return jobs


def run_job(np: int, command: list, timeout: float = 3600, capture: bool = True) -> str:
    """Run `command` on `np` ranks of this host under the installed mpiexec; return its stdout
    (empty where not `capture`d: the job prints to the console).

    Raises:
        subprocess.CalledProcessError: the job failed.
        TimeoutError: it ran past `timeout` seconds; its whole process group was killed, so no
            rank is left behind.
    """
    from horovodlite.run.hosts import default_hosts
    from horovodlite.run.mpi_launcher import build_command, detect_flavour, find_mpiexec

    mpiexec = find_mpiexec()
    argv = build_command(detect_flavour(mpiexec), mpiexec, np, default_hosts(np), command)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE if capture else None, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError(f"{' '.join(argv)}: killed after {timeout} s") from None
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv, out)
    return out or ""


def job_result(out: str) -> dict:
    """Return the JSON a worker printed on its line `RESULT {...}`."""
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def rank_counts(text: str) -> list:
    """'2,4' -> [1, 2, 4]: the single process always runs, as the baseline."""
    return [1] + [n for n in (int(part) for part in text.split(",")) if n > 1]


def slowest_rank(comm, seconds: list) -> list:
    """Element-wise maximum over the ranks of `comm` (every rank gets it)."""
    import numpy as np
    from mpi4py import MPI

    local = np.asarray(seconds, dtype=np.float64)
    out = np.empty_like(local)
    comm.Allreduce(local, out, op=MPI.MAX)
    return out.tolist()


def summary(np: int, model: str, parameters: int, contender: str, seconds: list) -> dict:
    """One result row: median and 10th/90th percentiles of the step times, in ms."""
    ordered = sorted(seconds)
    return {
        "np": np,
        "model": model,
        "parameters": parameters,
        "contender": contender,
        "median_ms": 1e3 * statistics.median(ordered),
        "p10_ms": 1e3 * ordered[len(ordered) // 10],
        "p90_ms": 1e3 * ordered[(9 * len(ordered)) // 10],
        "steps": len(ordered),
    }


def machine(load_before: tuple, **versions) -> dict:
    return {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        **versions,
        "load_average_1min_before_after": [load_before[0], os.getloadavg()[0]],
    }


def table(results: list, contenders: tuple, ratio: tuple) -> str:
    """A markdown table of median step times per (model, np), with ratio[0] / ratio[1]."""
    rows = {}
    for r in results:
        rows.setdefault((r["model"], r["np"]), {})[r["contender"]] = r["median_ms"]
    header = ["model", "np", *contenders, "/".join(ratio)]
    lines = [" | ".join(header), " | ".join("---" for _ in header)]
    for (model, np), by in sorted(rows.items()):
        value = by[ratio[0]] / by[ratio[1]] if ratio[0] in by and ratio[1] in by else None
        cells = [f"{by[c]:.1f}" if c in by else "" for c in contenders]
        lines.append(" | ".join([model, str(np), *cells, f"{value:.2f}" if value else ""]))
    return "\n".join(f"| {line} |" for line in lines)


def run_and_report(script: str, args, contenders: tuple, ratio: tuple, versions) -> None:
    """The driver: run the jobs, write args.out (JSON), print the table.

    `versions()` returns the framework versions for the report (imported after the jobs, so
    the driver does not hold a framework in memory while they run).
    """
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    load_before = os.getloadavg()
    jobs = run_jobs(script, rank_counts(args.np), sys.argv[1:], args.out, timeout=3600)
    name = os.path.basename(script)
    report = {
        "benchmark": os.path.splitext(name)[0],
        "command": " ".join(["python", f"benchmarks/{name}", *sys.argv[1:]]),
        "machine": machine(load_before, **versions()),
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "out")},
        "threads_per_rank": {job["np"]: job["threads"] for job in jobs},
        "equivalence_checks_max_abs_diff": {
            f"np{job['np']} {check}": diff for job in jobs for check, diff in job["checks"].items()
        },
        "results": [r for job in jobs for r in job["results"]],
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(table(report["results"], contenders, ratio=ratio))
    print(f"median step time in ms; written to {args.out}")


def turn_arguments(description: str, *, sizes: str, count: int, block_seconds: float,
                   unit: str):  # fmt: skip
    """Return the parsed arguments of a benchmark of grouped calls timed in turns."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--sizes", default=sizes, help=f"bytes per {unit}")
    parser.add_argument("--count", type=int, default=count, help=f"{unit}s per grouped call")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=block_seconds)
    parser.add_argument("--out", default=None, help="write the rows as JSON here (rank 0)")
    return parser.parse_args()


def save_rows(out, benchmark: str, rows: list) -> None:
    """Write `rows` as `benchmark`'s JSON to `out` (nothing when `out` is None)."""
    if out:
        with open(out, "w") as f:
            json.dump({"benchmark": benchmark, "rows": rows}, f, indent=1)


def timed_in_turns(comm, calls: dict, repeats: int, block_seconds: float) -> dict:
    """Return {name: median seconds per call} of `calls` (name -> a call), run in turns.

    Each call is sized to about `block_seconds` a block from one timed call; then `repeats`
    rounds, the order rotated each round, each block after a barrier, keeping the slowest
    rank's mean per block.
    """
    from mpi4py import MPI

    counts = {}
    for name, call in calls.items():
        call()  # (a jitted call compiles here)
        start = time.perf_counter()
        call()
        once = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        counts[name] = max(2, min(2000, int(block_seconds / max(once, 1e-7))))
    times = {name: [] for name in calls}
    names = list(calls)
    for repeat in range(repeats):
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(counts[name]):
                calls[name]()
            mean = (time.perf_counter() - start) / counts[name]
            times[name].append(comm.allreduce(mean, op=MPI.MAX))
    return {name: statistics.median(values) for name, values in times.items()}
