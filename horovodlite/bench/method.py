"""The measurement method of OSU Micro-Benchmarks and nccl-tests, on any MPI communicator.

For each message size and each contender: an estimate of one call's time sets how many timed
iterations fit the time budget (many for small messages, few for large) and how many warm-up
calls precede them. Each timed block starts after a barrier, times `iterations` back-to-back
calls on every rank, and keeps the slowest rank's mean; the barrier and the reduction of the
ranks' times stay outside the timed region. The sweep (sweep.py) interleaves the contenders'
blocks and reports the median block of each.
"""

import time
from typing import NamedTuple

from mpi4py import MPI

__all__ = [
    "BUS_FACTORS",
    "Schedule",
    "Timing",
    "bus_factor",
    "message_sizes",
    "calibrate",
    "format_size",
    "parse_size",
    "timed_block",
    "warm_up",
]

# nccl-tests' bus bandwidth factors: what each rank's busiest link carries, per byte of message,
# for the bandwidth-optimal algorithm. busbw = algbw * factor is comparable to the link rate.
BUS_FACTORS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "alltoall": lambda n: (n - 1) / n,  # measured with --device cuda only
}

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
}


def bus_factor(collective: str, ranks: int) -> float:
    """Return nccl-tests' bus bandwidth factor for `collective` on `ranks` ranks."""
    return BUS_FACTORS[collective](ranks) if ranks > 1 else 1.0


def parse_size(text: str) -> int:
    """Return a byte count from "8", "64K", "1MiB" or "64M" (binary units).

    Raises:
        ValueError: not a size.
    """
    raw = str(text).strip().lower()
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number) :].strip()
    if unit not in _UNITS or not number:
        raise ValueError(f"{text!r} is not a size: write e.g. 8, 64K, 1M or 64MiB")
    return int(float(number) * _UNITS[unit])


def format_size(nbytes: int) -> str:
    """Return "8 B", "64 KiB", "1 MiB" (exact binary multiples; else bytes)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def message_sizes(smallest: int, largest: int, factor: int = 2) -> list:
    """Return the sweep smallest, smallest*factor, ... up to and including largest."""
    if smallest < 1 or largest < smallest or factor < 2:
        raise ValueError(
            f"need 1 <= smallest <= largest and factor >= 2, got {smallest}, {largest}, {factor}"
        )
    sizes, size = [], smallest
    while size <= largest:
        sizes.append(size)
        size *= factor
    if sizes[-1] != largest:
        sizes.append(largest)
    return sizes


class Schedule(NamedTuple):
    """How long to measure each size: a time budget per timed block, clamped iteration counts."""

    seconds: float = 0.1  # target length of one timed block
    min_iterations: int = 5
    max_iterations: int = 10000
    warmup_fraction: float = 0.1  # warm-up iterations as a fraction of the timed ones
    min_warmup: int = 2
    repeats: int = 3  # timed blocks; the median is reported


class Timing(NamedTuple):
    """One contender at one size: the slowest rank's seconds per call in each timed block."""

    iterations: int
    warmup: int
    samples: tuple  # one per timed block, slowest rank's mean seconds per call

    @property
    def median(self) -> float:
        ordered = sorted(self.samples)
        middle = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[middle]
        return (ordered[middle - 1] + ordered[middle]) / 2


def timed_block(comm, call, iterations: int) -> float:
    """Return the slowest rank's mean seconds per call over `iterations` back-to-back calls.

    The barrier before and the reduction after are outside the timed region.
    """
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        call()
    elapsed = time.perf_counter() - start
    return comm.allreduce(elapsed / iterations, op=MPI.MAX)


def warm_up(comm, call, calls: int) -> None:
    """Run `call()` `calls` times, untimed, after a barrier."""
    comm.Barrier()
    for _ in range(calls):
        call()


def calibrate(comm, call, schedule: Schedule) -> tuple:
    """Return (timed iterations, warm-up iterations) for `call`, the same on every rank.

    One untimed call (allocations, connections) and a short probe estimate the slowest rank's
    time per call; the timed block then fills `schedule.seconds`, within the clamps.
    """
    warm_up(comm, call, 1)
    probe = timed_block(comm, call, 1)
    if probe * 20 < schedule.seconds:  # cheap calls: refine the estimate over more of them
        probe = timed_block(comm, call, max(1, min(1000, int(schedule.seconds / 10 / probe))))
    iterations = int(schedule.seconds / max(probe, 1e-9))
    iterations = max(schedule.min_iterations, min(schedule.max_iterations, iterations))
    warmup = max(schedule.min_warmup, int(iterations * schedule.warmup_fraction))
    return iterations, warmup
