"""When the engine thread sleeps, and what wakes it: work on its own rank, or another rank.

Every negotiation is a collective, so the engines of all ranks must cycle together. They sleep
together too: when a cycle shows that no rank has asynchronous work (nothing pending, nobody
joined), every engine sleeps, and no cycle runs until some rank has work again. That rank's
engine wakes on its own (a submit, join or shutdown sets its event) and sends a wake-up note to
every other engine, which reads it within a few milliseconds. Notes carry the number of the
sleep they end, the same on every rank since every rank sleeps after the same cycles, so a note
that arrives after its sleep has ended is ignored instead of ending the next one.

A sleeping engine tests for notes with a back-off up to 2 ms (20 ms after a second of sleep), so
an idle job costs a fraction of a percent of a core per rank. Each test takes the GIL and MPI
from a thread of the rank that runs synchronous collectives meanwhile: 200 of them right after
asynchronous work took 1.3 times as long with tests from 100 µs (docs/engine.md). So the
back-off starts at 100 µs only where a note from another rank ended the last sleep (a rank with
no work of its own, which others wait for: a process set's non-members, say); an engine whose
own work woke it (all ranks submit, as in data-parallel training) tests every 2 ms from the start.

An awake engine cycles once per cycle time, so that requests submitted meanwhile (a backward
pass's gradients) are negotiated and fused together rather than one cycle each. A submission
does not shorten that pause; somebody waiting for a result (synchronize(), join(), shutdown())
does (`flush`): nothing else is coming from that thread. A flush ends the pause before two
cycles, not one: another rank's engine may have begun the first before that rank's requests
came (a rank with nothing of its own cycles at once), and that rank flushes just after it.
Where a rank has no spare core, its engine does not cycle while its own requests keep coming
and nobody waits (`gathering_left`), for longer on one host than across hosts.
"""

import contextlib
import threading
import time

import numpy as np
from mpi4py import MPI

from .waiting import Inbox

__all__ = [
    "Wakeup",
    "gathering_left",
    "gathering_times",
    "overlap_pays",
    "GATHER_ONE_HOST",
    "GATHER_ACROSS_HOSTS",
]

_TAG = 91
_FIRST_POLL, _MAX_POLL, _LONG_POLL = 100e-6, 2e-3, 20e-3  # (_FIRST_POLL: after a note woke us)
_LONG_SLEEP = 1.0  # seconds asleep after which notes are tested less often
# A rank without a spare core gathers requests nobody waits for while more keep coming (a
# backward pass, a loop of *_async calls), until QUIET passes without a new one or the oldest
# has waited LONGEST: work not waited for must still progress. The two depend on where the
# bytes go. On one host moving them costs the computation's own CPU, so a cycle inside a
# backward pass only adds a negotiation: QUIET there outlasts the slowest layer's backward on
# one core, so that a pass is gathered whole. Across hosts a transfer mostly waits on the
# network, where an early start of the first gradients can hide it, so the times are shorter
# (a longer gathering across hosts was not measured). LONGEST leaves room to submit a whole
# backward pass on a loaded machine: a shorter cap split one into several fused batches, each a
# ring of its own. The measurements: docs/benchmarks.md, "Figures behind the code's constants".
GATHER_ONE_HOST = (0.5, 5.0)  # (QUIET, LONGEST) seconds
GATHER_ACROSS_HOSTS = (0.05, 0.5)


def overlap_pays(cores_per_rank: float) -> bool:
    """Return whether each rank of this host has a spare core for its engine
    (`cores_per_rank`: hosts.cores_per_rank).

    Where every rank has one core (ranks >= cores: CPU training on a small machine), the
    engine's work during the backward pass is added to it rather than hidden behind it
    (measured in docs/torch.md), so the engine then cycles only once results are waited for.
    """
    return cores_per_rank >= 2


def gathering_times(one_host: bool) -> tuple:
    """Return (quiet, longest): how long a rank without a spare core gathers its requests."""
    return GATHER_ONE_HOST if one_host else GATHER_ACROSS_HOSTS


def gathering_left(submitted: list, quiet: float, longest: float) -> float:
    """Return how many more seconds to gather requests submitted at these monotonic times:
    until `quiet` seconds pass without a new one, or the oldest has waited `longest`."""
    if not submitted:
        return 0.0  # nothing of our own: cycle, other ranks may wait
    until = min(max(submitted) + quiet, min(submitted) + longest)
    return max(0.0, until - time.monotonic())


class Wakeup:
    """The engine's alarm clock: a local event, and notes between the engines of all ranks.

    Args:
        comm: the engines' communicator (notes are point-to-point messages with their own tag,
            so they never match the negotiation's collectives).
        generation: the number of this init() in the process, the same on every rank.
    """

    def __init__(self, comm: MPI.Comm, generation: int):
        self._comm = comm
        self._generation = generation  # notes of an earlier init() may reach us: see waiting.py
        self._work = threading.Event()  # this rank has something for the engine
        self._flush = threading.Event()  # and somebody asked for a result
        self._eager = 0  # cycles still to begin without a pause, after a flush
        self._lock = threading.Lock()
        self._waiters = 0  # threads blocked in synchronize() now
        self._inbox = Inbox(comm, _TAG, 2)  # notes: the sleep it ends, the init's number
        self.sleeps = 0  # sleeps so far; the engines start asleep, in sleep 0
        self.noted = False  # whether another rank's note ended the last sleep (see the module)

    def set(self) -> None:
        """Wake this rank's engine if it sleeps: work was submitted."""
        if not self._work.is_set():  # set() notifies under a lock: 161 gradients, 161 calls
            self._work.set()

    def clear(self) -> None:
        """Forget work and waiters seen so far: the cycle that put the engines to sleep served
        them (a thread waiting in synchronize() flushes until its result came)."""
        self._work.clear()
        self._flush.clear()
        self._eager = 0

    def flush(self) -> None:
        """Wake this rank's engine and end its pauses before the next two cycles: somebody
        waits for a result."""
        with self._lock:  # (the engine thread counts it down)
            self._eager = 2
        self._flush.set()
        self._work.set()

    @contextlib.contextmanager
    def waiting(self):
        """Mark the block as a thread waiting for a result: the engine cycles without delay."""
        with self._lock:
            self._waiters += 1
        self.flush()
        try:
            yield
        finally:
            with self._lock:
                self._waiters -= 1

    def pause(self, seconds: float) -> bool:
        """Wait between two busy cycles: `seconds`, or less if somebody waits for a result.

        Returns whether somebody waits: a thread is blocked in waiting(), or flush() was called
        since the last pause, or before the one before it.
        """
        if seconds > 0 and not self._eager:
            self._flush.wait(seconds)
        self._flush.clear()
        with self._lock:
            if self._eager:
                self._eager -= 1
                return True
        return self._waiters > 0

    def sleep(self) -> None:
        """Sleep until this rank has work (then wake the others) or another rank wakes us."""
        poll, start = _FIRST_POLL if self.noted else _MAX_POLL, time.monotonic()
        while True:
            if self._work.wait(poll):
                self._work.clear()
                self._woken_by_another()  # read the notes that came: unread ones pile up
                self._wake_others()
                self.noted = False
                break
            if self._woken_by_another():
                self.noted = True
                break
            longest = _MAX_POLL if time.monotonic() - start < _LONG_SLEEP else _LONG_POLL
            poll = min(2 * poll, longest)

    def agreed_to_sleep(self) -> None:
        """Count a sleep that every rank's engine agreed on (the next sleep's number)."""
        self.sleeps += 1

    def _woken_by_another(self) -> bool:
        # Older notes ended older sleeps, or came from an earlier init().
        current = [self.sleeps, self._generation]
        return any(note.tolist() == current for note in self._inbox.arrived())

    def _wake_others(self) -> None:
        note = np.array([self.sleeps, self._generation], dtype=np.int64)
        self._inbox.send(note, range(self._comm.size))

    def close(self) -> None:
        """Stop listening for notes; let this rank's notes go out first (at most 1 s)."""
        self._inbox.close()
