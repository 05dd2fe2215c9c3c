"""`horovodlite-run`: start a horovodlite job with the installed MPI launcher.

horovodlite-run -np 4 -H host1:2,host2:2 python train.py --epochs 3
horovodlite-run -np 4 --simulated-hosts 2:100mbit python train.py
horovodlite-run python train.py        # inside a Slurm, PBS, LSF or MPI Operator job
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import subprocess
import sys

from ..version import __version__
from .allocation import detect_allocation
from .elastic import ElasticLauncher
from .elastic_setup import (
    DEFAULT_DISCOVERY_INTERVAL,
    DEFAULT_ELASTIC_TIMEOUT,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_RESTART_DELAY,
    check_options,
)
from .errors import LaunchError
from .exit_watch import ExitWatch
from .hosts import (
    check_reachable,
    check_slots,
    default_hosts,
    hosts_argument,
    launcher_hosts,
    parse_hostfile,
    parse_hosts,
)
from .mpi_launcher import (
    FLAVOUR_NAMES,
    HYDRA,
    build_command,
    detect_flavour,
    find_mpiexec,
    settings_env,
    srun_command,
)

__all__ = ["build_parser", "environment", "main"]

_EPILOG = """\
settings reach every rank as environment variables:
  --fusion-threshold-mb   HOROVODLITE_FUSION_THRESHOLD (bytes)
  --cycle-time-ms         HOROVODLITE_CYCLE_TIME (ms)
  --timeline-filename     HOROVODLITE_TIMELINE (absolute path)
  --stall-check-time      HOROVODLITE_STALL_CHECK_TIME_SECONDS
HOROVODLITE_MPIEXEC chooses the launcher (default: mpiexec beside this Python, else on PATH).
Give launcher arguments with '=': --mpi-args="-launcher fork".
"""


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of horovodlite-run."""
    parser = argparse.ArgumentParser(
        prog="horovodlite-run",
        description="Run a horovodlite job on MPI (MPICH's Hydra or Open MPI, detected).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "-np",
        "--num-proc",
        type=int,
        metavar="N",
        help="number of processes (default: all slots of -H/--hostfile, else the tasks of "
        "the scheduler's allocation: Slurm, PBS, LSF, Kubernetes MPI Operator)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "-H",
        "--hosts",
        metavar="HOST:SLOTS,...",
        help="hosts and their slots, e.g. host1:2,host2:2 (default: the scheduler's "
        "allocation, else localhost)",
    )
    where.add_argument(
        "--hostfile", metavar="FILE", help="file of 'host slots=N' or 'host:N' lines"
    )
    where.add_argument(
        "--simulated-hosts",
        metavar="K[:RATE[:DELAY]]",
        help="run on K simulated hosts (network namespaces on this machine, needs "
        "root), links capped at RATE (e.g. 100mbit) with DELAY (e.g. 0.1ms)",
    )
    parser.add_argument(
        "--launcher",
        choices=("mpiexec", "srun"),
        default="mpiexec",
        help="start the ranks with MPI's launcher (default) or, inside a Slurm job, with srun",
    )
    parser.add_argument(
        "--parameter-servers",
        action="store_true",
        help="the job trains with hvd.ps: a worker that dies does not end the job (MPICH's "
        "Hydra: -disable-auto-cleanup); see docs/ps.md",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the hosts found and the launch command, and exit without running it",
    )
    parser.add_argument(
        "--mpi-args",
        metavar="ARGS",
        default="",
        help="extra launcher arguments, split like a shell would (not run by one)",
    )
    parser.add_argument(
        "--fusion-threshold-mb", type=float, metavar="MB", help="tensor fusion buffer size in MiB"
    )
    parser.add_argument(
        "--cycle-time-ms", type=float, metavar="MS", help="engine cycle time in milliseconds"
    )
    parser.add_argument(
        "--timeline-filename",
        metavar="PATH",
        help="write a Chrome-trace timeline of the engine to PATH",
    )
    parser.add_argument(
        "--stall-check-time",
        type=float,
        metavar="SECONDS",
        help="warn when a collective waits this long for some ranks",
    )
    elastic = parser.add_argument_group(
        "elastic training",
        "restart the job when a worker fails and resize it to the slots available "
        "(any of these flags makes the run elastic; see docs/elastic.md)",
    )
    elastic.add_argument("--min-np", type=int, metavar="A",
                         help="fewest processes the job runs with (default: -np)")  # fmt: skip
    elastic.add_argument("--max-np", type=int, metavar="B",
                         help="most processes the job grows to (default: -np)")  # fmt: skip
    elastic.add_argument(
        "--host-discovery-script",
        metavar="SCRIPT",
        help="executable printing the available hosts, one 'hostname:slots' or 'hostname' a "
        "line; run at each start and every --discovery-interval seconds",
    )
    elastic.add_argument(
        "--max-restarts",
        type=int,
        metavar="K",
        help=f"restarts after failures before giving up (default {DEFAULT_MAX_RESTARTS}; "
        "restarts to add hosts are not counted)",
    )
    elastic.add_argument(
        "--restart-delay",
        type=float,
        metavar="SECONDS",
        help=f"pause before a restart (default {DEFAULT_RESTART_DELAY:g})",
    )
    elastic.add_argument(
        "--discovery-interval",
        type=float,
        metavar="SECONDS",
        help=f"how often the discovery script runs while the job runs (default "
        f"{DEFAULT_DISCOVERY_INTERVAL:g})",
    )
    elastic.add_argument(
        "--elastic-timeout",
        type=float,
        metavar="SECONDS",
        help=f"how long to wait for --min-np slots before giving up (default "
        f"{DEFAULT_ELASTIC_TIMEOUT:g})",
    )
    parser.add_argument(
        "--skip-host-check",
        action="store_true",
        help="do not check that remote hosts answer over ssh before launching",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print the launcher command and environment settings"
    )
    parser.add_argument(
        "--check-build",
        action="store_true",
        help="print the version, MPI library, available frameworks and the scheduler's "
        "allocation, and exit",
    )
    parser.add_argument("--version", action="version", version=f"horovodlite {__version__}")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program and its arguments, e.g. python train.py")  # fmt: skip
    return parser


def parse_simulated_hosts(text: str) -> tuple:
    """Parse `K[:RATE[:DELAY]]` into (K, rate or None, delay or None)."""
    parts = text.split(":")
    if len(parts) > 3 or not parts[0].isdigit() or int(parts[0]) < 1:
        raise ValueError(
            f"--simulated-hosts {text!r}: expected K[:RATE[:DELAY]], e.g. 2, 2:100mbit or "
            f"2:1gbit:0.1ms"
        )
    rate = parts[1] if len(parts) > 1 and parts[1] else None
    delay = parts[2] if len(parts) > 2 and parts[2] else None
    return int(parts[0]), rate, delay


def execute(argv: list, env: dict) -> int:
    """Run `argv`, passing on SIGINT and SIGTERM; return its exit status (128+N for signal N)."""
    child = subprocess.Popen(argv, env=env)

    def forward(signum, frame):
        if child.poll() is None:
            child.send_signal(signum)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, forward)
        except ValueError:  # not the main thread: signals stay as they are
            pass
    try:
        returncode = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return returncode if returncode >= 0 else 128 - returncode


def _verbose(argv: list, settings: dict) -> None:
    for name, value in settings.items():
        print(f"horovodlite-run: {name}={value}", file=sys.stderr)
    print(f"horovodlite-run: {shlex.join(argv)}", file=sys.stderr, flush=True)


def _run_simulated(args, settings: dict, mpi_args: list) -> int:
    from .simcluster import SimulatedCluster

    count, rate, delay = parse_simulated_hosts(args.simulated_hosts)
    if args.num_proc is None:
        raise ValueError("--simulated-hosts needs -np: e.g. -np 4 --simulated-hosts 2")
    if args.num_proc < 1:
        raise ValueError(f"-np must be at least 1, got {args.num_proc}")
    slots = math.ceil(args.num_proc / count)
    for name, value in settings.items():
        mpi_args = ["-genv", name, value, *mpi_args]
    with SimulatedCluster(count, rate=rate, delay=delay) as cluster:
        argv, env = cluster.mpiexec(args.num_proc, args.command, slots, settings, mpi_args)
        if args.verbose:
            print(cluster.describe(), file=sys.stderr)
            _verbose(argv, settings)
        return execute(argv, env)


def _hosts_and_tasks(args) -> tuple:
    """Return (hosts or None, default -np or None, Allocation or None): -H, --hostfile, else
    the scheduler's allocation (an explicit list wins)."""
    if args.hosts is not None:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile is not None:
        hosts = parse_hostfile(args.hostfile)
    else:
        allocation = detect_allocation()
        if allocation is None:
            return None, None, None
        return allocation.hosts, allocation.tasks, allocation
    return hosts, sum(h.slots for h in hosts), None


def _check_fits(np: int, allocation) -> None:
    slots = sum(h.slots for h in allocation.hosts)
    if np > slots:
        raise ValueError(
            f"-np {np} needs {np} slots, but the {allocation.scheduler} allocation offers "
            f"{slots} ({hosts_argument(allocation.hosts)}, from {allocation.source}): lower -np "
            f"or ask the scheduler for more tasks"
        )


def _run(args, settings: dict, mpi_args: list) -> int:
    hosts, default_np, allocation = _hosts_and_tasks(args)
    if args.num_proc is None and hosts is None:
        raise ValueError(
            "give -np N (and optionally -H host1:2,host2:2 or --hostfile FILE); no scheduler "
            "allocation (Slurm, PBS, LSF, Kubernetes MPI Operator) was found to take them from"
        )
    np = args.num_proc if args.num_proc is not None else default_np
    if allocation is not None:
        _check_fits(np, allocation)
    if args.launcher == "srun":
        if allocation is None or allocation.scheduler != "Slurm":
            raise ValueError(
                "--launcher srun starts ranks inside a Slurm job (sbatch or salloc), and no "
                "Slurm allocation was found: drop -H/--hostfile, or use --launcher mpiexec"
            )
        argv = srun_command(np, args.command, mpi_args)
        label = "srun (Slurm)"
    else:
        hosts = launcher_hosts(hosts) if hosts else default_hosts(np)
        check_slots(hosts, np)
        mpiexec = find_mpiexec()
        flavour = detect_flavour(mpiexec)
        argv = build_command(flavour, mpiexec, np, hosts, args.command, settings, mpi_args)
        label = f"{mpiexec} ({FLAVOUR_NAMES[flavour]})"
    if args.dry_run:
        found = allocation.describe() if allocation else "no scheduler allocation"
        print(f"horovodlite-run: {found}")
        print(f"horovodlite-run: {np} processes, launcher {label}")
        for name, value in settings.items():
            print(f"horovodlite-run: {name}={value}")
        print(shlex.join(argv), flush=True)
        return 0
    # Under Slurm and LSF, Hydra and Open MPI start remote ranks with the scheduler's own
    # tools (srun, blaunch), not ssh: an ssh probe would fail where ssh is not allowed.
    if args.launcher == "mpiexec" and not args.skip_host_check:
        if allocation is None or allocation.scheduler not in ("Slurm", "LSF"):
            check_reachable(hosts)
    if args.verbose:
        if allocation is not None:
            print(f"horovodlite-run: {allocation.describe()}", file=sys.stderr)
        print(f"horovodlite-run: launcher {label}", file=sys.stderr)
        _verbose(argv, settings)
    return execute(argv, {**os.environ, **settings})


_ELASTIC_FLAGS = ("min_np", "max_np", "host_discovery_script", "max_restarts", "restart_delay",
                  "discovery_interval", "elastic_timeout")  # fmt: skip


def _is_elastic(args) -> bool:
    return any(getattr(args, name) is not None for name in _ELASTIC_FLAGS)


def _run_elastic(args, settings: dict, mpi_args: list) -> int:
    if args.host_discovery_script is not None and (
        args.hosts is not None or args.hostfile is not None
    ):
        raise ValueError("--host-discovery-script replaces -H/--hostfile: give one or the other")
    static = None
    if args.hosts is not None:
        static = launcher_hosts(parse_hosts(args.hosts))
    elif args.hostfile is not None:
        static = launcher_hosts(parse_hostfile(args.hostfile))
    num_proc = args.num_proc
    if num_proc is None and static:  # start on every slot the list offers, up to --max-np
        slots = sum(h.slots for h in static)
        slots = slots if args.max_np is None else min(slots, args.max_np)
        num_proc = slots if args.min_np is None or slots >= args.min_np else None
    options = check_options(
        num_proc, args.min_np, args.max_np, args.max_restarts, args.restart_delay,
        args.host_discovery_script, args.discovery_interval, args.elastic_timeout,
    )  # fmt: skip
    launch = dict(static_hosts=static, skip_host_check=args.skip_host_check,
                  verbose=args.verbose)  # fmt: skip
    if args.simulated_hosts is None:
        return ElasticLauncher(options, args.command, settings, mpi_args, **launch).run()
    from .simcluster import SimulatedCluster

    count, rate, delay = parse_simulated_hosts(args.simulated_hosts)
    with SimulatedCluster(count, rate=rate, delay=delay) as cluster:
        if args.verbose:
            print(cluster.describe(), file=sys.stderr)
        launch["static_hosts"] = None
        return ElasticLauncher(options, args.command, settings, mpi_args, cluster=cluster,
                               **launch).run()  # fmt: skip


def _survive_rank_exits(launcher: str) -> list:
    """Return the launcher arguments that let the other ranks go on when one exits or dies."""
    if launcher == "srun":
        raise ValueError("--parameter-servers is not supported with --launcher srun (which ends "
                         "the step when a task fails): use --launcher mpiexec")  # fmt: skip
    mpiexec = find_mpiexec()
    if detect_flavour(mpiexec) != HYDRA:
        raise LaunchError(
            f"--parameter-servers needs MPICH's Hydra (-disable-auto-cleanup), and {mpiexec} is "
            "Open MPI, whose equivalent horovodlite-run does not pass: set HOROVODLITE_MPIEXEC "
            "to MPICH's mpiexec, or drop the flag (a dying worker then ends the job)"
        )
    return ["-disable-auto-cleanup"]


@contextlib.contextmanager
def environment(variables: dict):
    """Set `variables` in os.environ for the block, then restore what was there (main() may run
    inside a user's process; the benchmark's contenders take turns in one)."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main(argv: list | None = None) -> int:
    """Run horovodlite-run with `argv` (default: sys.argv[1:]); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.check_build:
        from .check_build import build_report

        print(build_report())
        return 0
    if not args.command:
        parser.error("no command to run: e.g. horovodlite-run -np 2 python train.py")
    try:
        settings = settings_env(
            args.fusion_threshold_mb, args.cycle_time_ms, args.timeline_filename,
            args.stall_check_time,
        )  # fmt: skip
        try:
            mpi_args = shlex.split(args.mpi_args)
        except ValueError as exc:
            raise ValueError(f"--mpi-args {args.mpi_args!r}: {exc}") from None
        if args.parameter_servers:
            mpi_args = _survive_rank_exits(args.launcher) + mpi_args
        if args.dry_run and (_is_elastic(args) or args.simulated_hosts is not None):
            raise ValueError("--dry-run shows plain launches: drop the elastic flags and "
                             "--simulated-hosts")  # fmt: skip
        if _is_elastic(args):  # each run of an elastic job has its own exit watch
            return _run_elastic(args, settings, mpi_args)
        # The watch's folder reaches the ranks of this host through the environment they
        # inherit, not the command line: ranks elsewhere cannot write to it.
        with ExitWatch() as watch, environment(watch.environment):
            run = _run_simulated if args.simulated_hosts is not None else _run
            status = run(args, settings, mpi_args)
            message = watch.message() if status != 0 else None
            if message:
                print(f"horovodlite-run: {message}", file=sys.stderr)
            return status
    except (ValueError, OSError) as exc:
        print(f"horovodlite-run: error: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"horovodlite-run: error: {exc}", file=sys.stderr)
        return 1
