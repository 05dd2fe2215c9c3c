"""Waiting without a busy core, and telling a slow peer from a dead one.

MPICH's blocking receives and probes spin on a core; on a host where ranks outnumber cores
that core is the one the awaited peer needs. So every wait here tests, yielding the core for
its first 2 ms (a fast reply arrives with no added latency), then sleeps with a back-off up to
1 ms, 10 ms once it has waited a second, as the core's Watch does (horovodlite/waiting.py).

A peer on the same host is dead when its process is gone (or a zombie); MPI itself says
nothing, as the job keeps running only under `mpiexec -disable-auto-cleanup`. A peer on another
host is taken for dead after `silence` seconds without a message while it is expected to send.
"""

import os
import time
from typing import Callable, Optional

from ...waiting import process_alive

__all__ = ["wait_for", "Peer", "CHECK_EVERY"]

_YIELD_SECONDS = 2e-3
_FIRST_SLEEP, _MAX_SLEEP = 20e-6, 1e-3
_LONG_WAIT, _LONG_SLEEP = 1.0, 10e-3
CHECK_EVERY = 0.25  # seconds between liveness checks of the peers a wait depends on


class Peer:
    """Another rank of the job: where it runs, and when it was last heard from."""

    def __init__(self, rank: int, host: str, pid: int, local: bool):
        self.rank, self.host, self.pid, self.local = rank, host, pid, local
        self.heard = time.monotonic()

    def alive(self, silence: float, expected: bool = True) -> bool:
        """Whether the peer lives; on another host, silence counts only where it is `expected`
        to send."""
        if self.local:
            return process_alive(self.pid)
        return not expected or time.monotonic() - self.heard < silence


def wait_for(test: Callable[[], Optional[object]], check: Callable[[], None]):
    """Call `test()` until it returns other than None and return that; call `check()` between.

    `check` runs every CHECK_EVERY seconds once the wait is long, and raises to end the wait
    (a dead peer, a timeout).
    """
    start = time.perf_counter()
    while time.perf_counter() - start < _YIELD_SECONDS:
        if (done := test()) is not None:
            return done
        os.sched_yield()
    delay, checked = _FIRST_SLEEP, start
    while (done := test()) is None:
        time.sleep(delay)
        now = time.perf_counter()
        delay = min(2 * delay, _MAX_SLEEP if now - start < _LONG_WAIT else _LONG_SLEEP)
        if now - checked >= CHECK_EVERY:
            checked = now
            check()
    return done
