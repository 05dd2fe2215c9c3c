"""The benchmark's command line: run a sweep inside an MPI job, or launch jobs and collect them.

Inside a job (`mpiexec -n 4 python -m horovodlite.bench ...`) every rank measures and rank 0
prints the tables and writes the files. With `--np 2,4` or `--simulated-hosts 4,8` this process
launches one job per setting (under mpiexec, or on a simulated cluster with capped links),
gathers their results, and writes one CSV, one JSON and one PNG per collective for all of them.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile

from .method import Schedule, format_size, message_sizes, parse_size
from .peers import ALL_CONTENDERS, COLLECTIVES

__all__ = ["build_parser", "main"]

DEFAULT_CONTENDERS = ALL_CONTENDERS


def _names(allowed):
    def parse(text: str) -> list:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown) or '(empty)'}: choose from {', '.join(allowed)}"
            )
        return names

    return parse


def _counts(text: str) -> list:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 2,4, got {text!r}")
    return counts


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of `python -m horovodlite.bench`."""
    parser = argparse.ArgumentParser(
        prog="python -m horovodlite.bench",
        description="Collective benchmarks in the manner of OSU Micro-Benchmarks and "
        "nccl-tests: horovodlite's algorithms against the MPI library and torch's Gloo.",
        epilog="Examples:\n"
        "  python -m horovodlite.bench --np 4\n"
        "  mpiexec -n 4 python -m horovodlite.bench --collectives allreduce --max-size 1M\n"
        "  python -m horovodlite.bench --simulated-hosts 4,8 --link-rate 1gbit "
        "--collectives allreduce --contenders ring,naive,mpi",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_argument_group("what to measure")
    what.add_argument(
        "--collectives",
        type=_names((*COLLECTIVES, "alltoall")),
        default=None,
        help=f"comma-separated (default: {','.join(COLLECTIVES)}; with --device cuda also "
        "alltoall)",
    )
    what.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu (default): numpy buffers, horovodlite's algorithms against MPI and Gloo; "
        "cuda: CUDA tensors, horovodlite against torch.distributed's NCCL (bench/gpu.py), "
        "one process per GPU",
    )
    what.add_argument(
        "--contenders",
        "--algorithms",
        type=_names(ALL_CONTENDERS),
        default=list(DEFAULT_CONTENDERS),
        help=f"comma-separated (default: {','.join(DEFAULT_CONTENDERS)}); "
        "gloo is skipped where torch is missing",
    )
    what.add_argument("--min-size", type=_size, default=8, help="smallest message (default 8)")
    what.add_argument(
        "--max-size", type=_size, default=64 << 20, help="largest message (default 64M)"
    )
    what.add_argument(
        "--size-factor", type=int, default=2, help="ratio of successive sizes (default 2)"
    )
    how = parser.add_argument_group("method")
    how.add_argument(
        "--time-per-size",
        type=float,
        default=0.1,
        metavar="SECONDS",
        help="target length of one timed block (default 0.1)",
    )
    how.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed blocks per size and contender; the median is reported (3)",
    )
    how.add_argument("--min-iterations", type=int, default=5, help="per timed block (5)")
    how.add_argument("--max-iterations", type=int, default=10000, help="per timed block (10000)")
    how.add_argument(
        "--warmup-fraction",
        type=float,
        default=0.1,
        help="warm-up calls as a fraction of the timed ones (0.1, at least 1)",
    )
    where = parser.add_argument_group("where (without these: inside the current MPI job)")
    where.add_argument(
        "--np",
        type=_counts,
        metavar="N[,N...]",
        help="launch one job per rank count on this machine",
    )
    where.add_argument(
        "--simulated-hosts",
        type=_counts,
        metavar="K[,K...]",
        help="launch one job per host count on a simulated cluster (root, "
        "iproute2); one rank per host unless --ranks-per-host",
    )
    where.add_argument("--ranks-per-host", type=int, default=1)
    where.add_argument(
        "--link-rate", default=None, help="cap on every simulated host's links, e.g. 1gbit"
    )
    where.add_argument("--delay", default=None, help="one-way delay of simulated links, e.g. 0.1ms")
    where.add_argument(
        "--timeout",
        type=float,
        default=3600,
        help="seconds before a launched job is killed (default 3600)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--out", default="bench-results", help="directory (default bench-results)")
    out.add_argument(
        "--name",
        default=None,
        help="file name prefix: NAME.csv, NAME.json, NAME_<collective>.png (default collectives, "
        "with --device cuda collectives_cuda)",
    )
    out.add_argument("--no-plot", action="store_true", help="write no PNG")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    # Set by the launcher for the jobs it starts.
    parser.add_argument("--worker-output", help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    parser.add_argument("--link-rate-bits", type=int, help=argparse.SUPPRESS)
    return parser


def _schedule(args) -> Schedule:
    return Schedule(
        seconds=args.time_per_size,
        min_iterations=args.min_iterations,
        max_iterations=args.max_iterations,
        warmup_fraction=args.warmup_fraction,
        min_warmup=1,
        repeats=args.repeats,
    )


def _validate(parser, args) -> None:
    if args.name is None:
        args.name = "collectives" if args.device == "cpu" else "collectives_cuda"
    if args.device == "cpu":
        if args.collectives is None:
            args.collectives = list(COLLECTIVES)
        if "alltoall" in args.collectives:
            parser.error("alltoall is measured with --device cuda only")
    else:
        from .gpu import COLLECTIVES as ON_GPUS

        if args.collectives is None:
            args.collectives = list(ON_GPUS)
        if args.simulated_hosts:
            parser.error("--device cuda runs on this machine's GPUs: no --simulated-hosts")
    if args.repeats < 1 or args.min_iterations < 1 or args.max_iterations < args.min_iterations:
        parser.error("need repeats >= 1 and 1 <= min-iterations <= max-iterations")
    if args.time_per_size <= 0:
        parser.error("--time-per-size must be positive")
    try:
        message_sizes(args.min_size, args.max_size, args.size_factor)
    except ValueError as exc:
        parser.error(str(exc))
    if args.np and args.simulated_hosts and len(args.np) > 1:
        parser.error("with --simulated-hosts, --np takes one count (ranks in all)")
    if (args.link_rate or args.delay) and not args.simulated_hosts:
        parser.error("--link-rate and --delay need --simulated-hosts")


def _progress_bar(total: int, enabled: bool):
    """Return (update(n, text), close()) drawing a tqdm bar on stderr, or no-ops."""
    try:
        from tqdm import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        return None, lambda: None
    bar = tqdm(total=total, unit="meas", file=sys.stderr, mininterval=0.5, dynamic_ncols=True)

    def update(n: int, text: str) -> None:
        bar.set_postfix_str(text, refresh=False)
        bar.update(n)

    return update, bar.close


def _setting_label(info: dict, rate_bits) -> str:
    hosts, ranks = info["hosts"], info["ranks"]
    if "gpu" in info:
        return f"{ranks} ranks, {hosts} host{'s' if hosts > 1 else ''}, {info['gpu']}"
    if hosts > 1 or rate_bits:
        link = f", {rate_bits / 1e9:g} Gbit/s links" if rate_bits else ""
        return f"{hosts} hosts x {info['ranks_per_host']} rank{link}"
    return f"{ranks} ranks, 1 host (shared memory, {info['cpu_count']} cores)"


def _measure_on_host(comm, args, schedule) -> tuple:
    """Measure numpy buffers on every rank of `comm`; return (rows, facts of the contenders)."""
    from .peers import make_contenders
    from .sweep import sweep

    sizes = message_sizes(args.min_size, args.max_size, args.size_factor)
    contenders, skipped = make_contenders(args.contenders, comm)
    root = comm.rank == 0
    if root:
        for name, reason in skipped.items():
            print(f"skipping {name}: {reason}", file=sys.stderr)
        print(
            f"horovodlite benchmark: {comm.size} ranks, sizes {format_size(sizes[0])} to "
            f"{format_size(sizes[-1])}, {', '.join(c.name for c in contenders)}",
            file=sys.stderr,
            flush=True,
        )
    total = sum(
        len(sizes) for collective in args.collectives for c in contenders if c.supports(collective)
    )
    update, close = _progress_bar(total, root and not args.no_progress)
    try:
        rows = sweep(comm, args.collectives, sizes, contenders, schedule, update)
    finally:
        close()
        for contender in contenders:
            contender.close()
    return rows, {"skipped": skipped}


def run_here(args) -> int:
    """Measure inside the current MPI job; rank 0 prints the tables and delivers the results."""
    from mpi4py import MPI

    import horovodlite as hvd

    from .report import format_expectations, format_tables
    from .sweep import facts

    if args.device == "cuda":
        from .gpu import cuda_missing, measure

        reasons = [r for r in MPI.COMM_WORLD.allgather(cuda_missing()) if r]
        if reasons:
            if MPI.COMM_WORLD.rank == 0:
                print(f"--device cuda: {reasons[0]}", file=sys.stderr)
            return 2
    else:
        measure = _measure_on_host
    hvd.init()
    comm = MPI.COMM_WORLD.Dup()
    schedule = _schedule(args)
    rows, extra = measure(comm, args, schedule)
    extra.update(link_rate_bits=args.link_rate_bits, schedule=schedule._asdict())
    info = facts(comm, extra)
    run = {
        "setting": args.setting or _setting_label(info, args.link_rate_bits),
        "facts": info,
        "rows": rows,
    }
    if comm.rank == 0:
        print(format_tables(run), flush=True)
        summary = format_expectations(run)
        if summary:
            print(
                f"\nall-reduce, {run['setting']}: the figures docs/benchmarks.md checks\n"
                + summary,
                flush=True,
            )
        _deliver(run, args)
    comm.Free()
    hvd.shutdown()
    return 0


def _deliver(run: dict, args) -> None:
    """Write the run where the launcher that started this job reads it, else into --out."""
    if args.worker_output:
        from .report import write_json

        write_json([run], args.worker_output)
    else:
        _write_outputs([run], args)


def _write_outputs(runs: list, args) -> None:
    from .report import write_csv, write_json

    os.makedirs(args.out, exist_ok=True)
    prefix = os.path.join(args.out, args.name)
    write_csv(runs, prefix + ".csv")
    write_json(runs, prefix + ".json")
    written = [prefix + ".csv", prefix + ".json"]
    if not args.no_plot:
        try:
            from .plot import plot_all
        except ImportError:  # pragma: no cover - plot.py imports matplotlib lazily
            plot_all = None
        try:
            written += plot_all(runs, prefix)
        except ImportError:
            print("no plots: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
    print("wrote " + ", ".join(written), flush=True)


def _worker_args(args) -> list:
    """Return the options that make a launched job measure what this invocation asks."""
    argv = [
        "--device",
        args.device,
        "--collectives",
        ",".join(args.collectives),
        "--contenders",
        ",".join(args.contenders),
        "--min-size",
        str(args.min_size),
        "--max-size",
        str(args.max_size),
        "--size-factor",
        str(args.size_factor),
        "--time-per-size",
        repr(args.time_per_size),
        "--repeats",
        str(args.repeats),
        "--min-iterations",
        str(args.min_iterations),
        "--max-iterations",
        str(args.max_iterations),
        "--warmup-fraction",
        repr(args.warmup_fraction),
    ]
    return argv + (["--no-progress"] if args.no_progress else [])


def _execute(argv: list, env: dict, timeout: float) -> int:
    """Run a job with its output passed through; kill its process group after `timeout`."""
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except BaseException as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if isinstance(exc, subprocess.TimeoutExpired):
            print(f"the job was killed after {timeout:g} s", file=sys.stderr)
            return 124
        raise


def launch(args) -> int:
    """Run one job per setting, then write the combined CSV, JSON and plots."""
    from horovodlite.run.hosts import default_hosts
    from horovodlite.run.mpi_launcher import build_command, detect_flavour, find_mpiexec

    from .report import read_json

    job = [sys.executable, "-m", "mpi4py", "-m", "horovodlite.bench", *_worker_args(args)]
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # Unwind on SIGTERM too, so that _execute() kills the job it started.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    runs = []
    with tempfile.TemporaryDirectory(prefix="horovodlite-bench-") as tmp:
        for index, np_ in enumerate(args.np if not args.simulated_hosts else []):
            result = os.path.join(tmp, f"{index}.json")
            mpiexec = find_mpiexec()
            argv = build_command(
                detect_flavour(mpiexec),
                mpiexec,
                np_,
                default_hosts(np_),
                job + ["--worker-output", result],
            )
            print(f"== {np_} ranks on this machine", file=sys.stderr, flush=True)
            code = _execute(argv, dict(os.environ), args.timeout)
            if code != 0:
                print(f"the {np_}-rank job failed (exit status {code})", file=sys.stderr)
                return code
            runs += read_json(result)
        for index, hosts in enumerate(args.simulated_hosts or []):
            code = _launch_simulated(args, hosts, job, os.path.join(tmp, f"s{index}.json"))
            if code != 0:
                return code
            runs += read_json(os.path.join(tmp, f"s{index}.json"))
    _write_outputs(runs, args)
    return 0


def _launch_simulated(args, hosts: int, job: list, result: str) -> int:
    from horovodlite.run.simcluster import SimulatedCluster

    per_host = args.ranks_per_host
    np_ = args.np[0] if args.np else hosts * per_host
    with SimulatedCluster(hosts, rate=args.link_rate, delay=args.delay) as cluster:
        extra = ["--worker-output", result]
        if cluster.rate_bits:
            extra += ["--link-rate-bits", str(cluster.rate_bits)]
        argv, env = cluster.mpiexec(np_, job + extra, slots_per_host=per_host)
        print(f"== {cluster.describe()}", file=sys.stderr, flush=True)
        code = _execute(argv, env, args.timeout)
    if code != 0:
        print(f"the job on {hosts} simulated hosts failed (exit status {code})", file=sys.stderr)
    return code


def main(argv: list = None) -> int:
    """Run the benchmark; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _validate(parser, args)
    if args.device == "cuda":
        from .gpu import cuda_missing

        missing = cuda_missing()  # fail here, before launching jobs that would all fail
        if missing:
            print(f"python -m horovodlite.bench --device cuda: {missing}", file=sys.stderr)
            return 2
    if args.np or args.simulated_hosts:
        return launch(args)
    return run_here(args)
