"""The sweep: every collective, every message size, every contender, measured side by side."""

import datetime
import os
import platform
import sys

from mpi4py import MPI

from .method import (
    Schedule,
    Timing,
    bus_factor,
    calibrate,
    format_size,
    timed_block,
    warm_up,
)

__all__ = ["element_count", "facts", "result_row", "sweep"]

ITEMSIZE = 4  # float32


def element_count(collective: str, nbytes: int, ranks: int) -> int:
    """Return the float32 count of a message of about `nbytes` (nccl-tests' sizes).

    As in nccl-tests, the size is the whole buffer: allgather's output and reducescatter's
    input, rounded down to a multiple of the rank count (and at least one element per rank).
    """
    count = max(1, nbytes // ITEMSIZE)
    if collective in ("allgather", "reducescatter"):
        count = max(ranks, count - count % ranks)
    return count


def result_row(collective, contender, count, ranks, timing: Timing, correct: bool) -> dict:
    """Return one measurement as a row of the results: `count` float32 elements on `ranks`."""
    nbytes = count * ITEMSIZE
    seconds = timing.median
    algbw = nbytes / seconds / 1e9
    return {
        "collective": collective,
        "contender": contender,
        "bytes": nbytes,
        "count": count,
        "ranks": ranks,
        "iterations": timing.iterations,
        "warmup": timing.warmup,
        "repeats": len(timing.samples),
        "time_us": seconds * 1e6,
        "time_us_min": min(timing.samples) * 1e6,
        "time_us_max": max(timing.samples) * 1e6,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * bus_factor(collective, ranks),
        "correct": correct,
    }


def sweep(comm, collectives, sizes, contenders, schedule: Schedule, progress=None) -> list:
    """Measure every contender on every collective and size; return one row per measurement.

    At each size all contenders are calibrated first; then their timed blocks take turns
    (repeat 1 of each, repeat 2 of each, ...), so a burst of background load hits them alike.
    After timing, each runs once more on known data and every rank checks the result.
    `progress(n, text)`, if given, is called after each measurement on every rank.
    """
    rows = []
    for collective in collectives:
        active = [c for c in contenders if c.supports(collective)]
        for size in sizes:
            count = element_count(collective, size, comm.size)
            cases, plans = {}, {}
            for contender in active:
                with contender.environment():
                    cases[contender.name] = case = contender.case(collective, count)
                    plans[contender.name] = calibrate(comm, case.call, schedule)
            samples = {contender.name: [] for contender in active}
            for repeat in range(schedule.repeats):
                for contender in active:
                    iterations, warmup = plans[contender.name]
                    call = cases[contender.name].call
                    with contender.environment():
                        warm_up(comm, call, warmup if repeat == 0 else schedule.min_warmup)
                        samples[contender.name].append(timed_block(comm, call, iterations))
            for contender in active:
                with contender.environment():
                    correct = cases[contender.name].verify()
                correct = comm.allreduce(correct, op=MPI.LAND)
                iterations, warmup = plans[contender.name]
                timing = Timing(iterations, warmup, tuple(samples[contender.name]))
                rows.append(
                    result_row(collective, contender.name, count, comm.size, timing, correct)
                )
                if progress is not None:
                    progress(1, f"{collective} {format_size(count * ITEMSIZE)} {contender.name}")
            cases.clear()
    return rows


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def facts(comm, extra: dict = None) -> dict:
    """Return what the results depend on: machine, ranks, libraries, settings."""
    import mpi4py
    import numpy

    import horovodlite
    from horovodlite import algorithms

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    hosts = comm.allreduce(1 if local.rank == 0 else 0)
    local_size = local.size
    local.Free()
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    info = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "ranks": comm.size,
        "hosts": hosts,
        "ranks_per_host": local_size,
        "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
        "mpi4py": mpi4py.__version__,
        "numpy": numpy.__version__,
        "torch": torch_version,
        "python": platform.python_version(),
        "horovodlite": horovodlite.__version__,
        "small_message_bytes": algorithms.SMALL_MESSAGE_BYTES,
        "environment": {k: v for k, v in os.environ.items() if k.startswith("HOROVODLITE_")},
        # Other work on the machine skews timings: the load average when the sweep ended.
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    info.update(extra or {})
    return info
