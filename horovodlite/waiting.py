"""Waiting for other ranks: at no cost while blocked, never forever, and awake to departures.

Every wait of the library on other ranks (a collective's agreement, the engine's negotiation,
join) goes through `Watch.wait`. It tests the MPI request for 2 ms, yielding the core between
tests (a fast collective finishes there, with no added latency, and where ranks outnumber cores
the one being waited for gets to run), then sleeps between tests with a back-off up to 1 ms
(10 ms once it has waited a second), so a rank blocked for long costs well under 1% of a core.
A metadata check, which usually completes within microseconds, waits with `Watch.check_waiter`:
where each rank of the host has a core of its own it first tests without yielding, as MPI's own
blocking calls do.
While it waits it reads the notices that ranks post on a private control communicator:

- LEFT: a rank shut horovodlite down or is exiting. A wait whose collective needs that rank
  raises HorovodLiteError naming it (after a short grace, in case the collective still
  completes), since it would otherwise wait forever.
- WAITING: a rank has waited over a second in a synchronous collective (identified by the
  digest of its fields; DONE when that wait ends). The ranks of a collective that sent none are
  the ones that did not arrive: stall warnings and the timeout name them. An engine that holds
  an asynchronous request with the same digest learns that ranks wait for it synchronously,
  which can never match: it fails its request and answers MISMATCH, and the waiting ranks raise
  MismatchError (engine.py). A WAITING notice also carries the collective's name, so an engine
  whose rank waits in hvd.synchronize() for a request that a rank blocked in a synchronous
  collective never submitted can tell both sides what they wait in (CROSSED): neither can go
  on, and every rank raises MismatchError naming both collectives.

After `Settings.collective_timeout` seconds a wait raises HorovodLiteError naming the collective
and the missing ranks, and the job is torn down (MPI_Abort) a few seconds later, so no rank
waits forever even where the error is caught. A wait that fails because a member left is torn
down the same way: its half of the collective stays posted (MPI cannot cancel a collective),
and MPI_Finalize would meet messages nobody receives (lifecycle.py aborts at exit instead).
"""

import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

from .exceptions import HorovodLiteError, MismatchError

__all__ = [
    "Watch",
    "LEFT_SHUTDOWN",
    "LEFT_EXIT",
    "Inbox",
    "default_wait",
    "teardown_later",
    "teardown_pending",
    "process_alive",
]

_log = logging.getLogger("horovodlite")

_TAG = 77
_LEFT, _WAITING, _DONE, _MISMATCH, _CROSSED = 1, 2, 3, 4, 5
# A notice: kind, sender, detail, generation, then UTF-8 text (a collective's name, a message).
_HEADER, _WORDS = 4, 128
_TEXT_BYTES = (_WORDS - _HEADER) * 8
_AGREED_SPAN = 2**62  # digests of collectives' fields lie in [0, 2**62): see agreement.digest
LEFT_SHUTDOWN, LEFT_EXIT = 1, 2  # why a rank left
_REASONS = {LEFT_SHUTDOWN: "called hvd.shutdown()", LEFT_EXIT: "exited"}

# Test, yielding the core between tests, this long before sleeping: a fast collective ends
# here with no added latency (a yield returns at once where no other process waits for the
# core), and where ranks outnumber cores the rank being waited for gets to run at once, where a
# short sleep would oversleep it and a plain spin would hold the core it needs (figures: docs/
# benchmarks.md, "Figures behind the code's constants").
_YIELD_SECONDS = 2e-3
# A check tests without yielding this long first, where each rank of the host has a core: on a
# busy machine a yield gives the core to another process for a time slice, while the partner is
# a few µs away. Where ranks outnumber cores the spin holds the core that the rank waited for
# needs, and a check took several times as long (figures: the same section of docs/benchmarks.md).
_SPIN_SECONDS = 50e-6
_FIRST_SLEEP, _MAX_SLEEP = 20e-6, 1e-3
_LONG_WAIT, _LONG_SLEEP = 1.0, 10e-3  # after a second, test less often: nobody is close
_NOTICE_AFTER = 1.0  # seconds in one wait before telling the others where this rank waits
_MARK_AFTER = 0.1  # seconds in one wait before the waiting marker file is created
_DEPARTURE_GRACE = 2.0  # seconds a wait goes on after a member left, in case it completes
_QUIET = 5e-3  # seconds without a note before a closing rank stops receiving them
_TEARDOWN_DELAY = 5.0  # seconds between a fatal error and MPI_Abort: time to print and unwind


class Watch:
    """Waits on MPI requests for one job, reading the control notices of every rank.

    Args:
        comm: a private duplicate of the job's communicator, for notices only.
        timeout: seconds after which a wait fails (Settings.collective_timeout).
        stall_check: seconds after which a wait logs who is missing, once.
        generation: the number of this init() in the process, the same on every rank.
        waiting_marker: a file to hold while a wait is long (horovodlite-run's exit watch reads
            it: a rank that ends while it waits on others did not end the job), or None.
        cores_per_rank: the cores each rank of this host has to itself (hosts.cores_per_rank):
            a check spins only where that is at least one.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        timeout: float,
        stall_check: float,
        generation: int,
        waiting_marker: Optional[str] = None,
        cores_per_rank: float = 1.0,
    ):
        self.comm, self.timeout, self.stall_check = comm, timeout, stall_check
        # MPI may reuse a freed communicator's context for a new one, so a notice sent before a
        # shutdown() could reach the next init()'s Watch: notices carry the init's number.
        self.generation = generation
        self._lock = threading.Lock()
        self._inbox = Inbox(comm, _TAG, _WORDS)
        self.left: dict = {}  # rank -> reason code
        self._waiting: dict = {}  # digest -> ranks that report waiting in it now
        self._mismatched: dict = {}  # digest -> ranks that hold it as an async request
        self._names: dict = {}  # digest -> the name of the collective waited in there
        self._crossed: dict = {}  # digest -> why the wait there can never end (CROSSED)
        self._own: dict = {}  # digest -> this rank's threads in a long wait there now
        self._closed = False
        self._waiting_marker = waiting_marker
        self._spin = _SPIN_SECONDS if cores_per_rank >= 1 else 0.0

    # -- notices ------------------------------------------------------------------------------

    def poll(self) -> None:
        """Read every notice that has arrived."""
        with self._lock:
            for note in [] if self._closed else self._inbox.arrived():
                kind, sender, detail, generation = (int(v) for v in note[:_HEADER])
                text = note[_HEADER:].tobytes().rstrip(b"\0").decode(errors="replace")
                if generation != self.generation:
                    pass  # from an earlier init() of this job
                elif kind == _LEFT:
                    self.left[sender] = detail
                elif kind == _WAITING:
                    self._waiting.setdefault(detail, set()).add(sender)
                    self._names[detail] = text
                elif kind == _DONE:
                    self._waiting.get(detail, set()).discard(sender)
                elif kind == _MISMATCH:
                    self._mismatched.setdefault(detail, set()).add(sender)
                elif kind == _CROSSED:
                    self._crossed[detail] = text

    def _notify(self, kind: int, detail: int, ranks: Sequence[int], text: str = "") -> None:
        me = self.comm.rank
        message = np.zeros(_WORDS, dtype=np.int64)
        message[:_HEADER] = kind, me, detail, self.generation
        raw = text.encode()[:_TEXT_BYTES]
        message[_HEADER:].view(np.uint8)[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        with self._lock:
            self._inbox.send(message, ranks)

    def held_async(self, identity: int, what: str) -> Optional[MismatchError]:
        """Return the error for this rank's asynchronous `what` (digest `identity`) where other
        ranks wait in it synchronously, or None; tell them (MISMATCH): the two never meet."""
        self.poll()
        with self._lock:
            waiters = sorted(self._waiting.get(identity, ()))
        if not waiters:
            return None
        # Every rank, not only those whose waiting notice came: the others waiting there learn
        # it too (the job is torn down, so a rank that is not there never meets a stale one).
        self._notify(_MISMATCH, identity, range(self.comm.size))
        me = self.comm.rank
        return MismatchError(
            f"{what}: rank {me} submitted it asynchronously while {_ranks(waiters)} called it "
            "synchronously: every rank must call a collective the same way"
        )

    def crossed(self, what: str, missing: Sequence[int]) -> Optional[MismatchError]:
        """Return the error for a wait in hvd.synchronize() on `what` that can never end, or None.

        It never ends when ranks that did not submit `what` (`missing`) are blocked in a
        synchronous collective (their WAITING notices tell) that this rank, a member, is not in:
        they cannot submit it before that collective ends, and it cannot end without this rank.
        Tells them (CROSSED) and tears the job down, as their collective stays posted.
        """
        self.poll()
        with self._lock:
            blocked = [
                (identity, self._names.get(identity, "collective"), sorted(waiters & set(missing)))
                for identity, waiters in self._waiting.items()
                if 0 <= identity < _AGREED_SPAN and not self._own.get(identity)
            ]
        blocked = [entry for entry in blocked if entry[2]]
        if not blocked:
            return None
        me, stuck = self.comm.rank, sorted({r for _, _, ranks in blocked for r in ranks})
        where = "; ".join(
            f"{_ranks(ranks)} wait{'s' if len(ranks) == 1 else ''} in the synchronous {name}"
            for _, name, ranks in blocked
        )
        message = (
            f"rank {me} waits in hvd.synchronize() for the asynchronous {what}, which "
            f"{_ranks(stuck)} did not submit, while {where}, which rank {me} did not call: "
            "neither side can go on. Every rank must call the same collectives in the same order, "
            "each the same way (synchronous, or *_async then synchronize); the job is torn down"
        )
        for identity, _, _ in blocked:  # every rank: as in held_async()
            self._notify(_CROSSED, identity, range(self.comm.size), message)
        teardown_later(message)
        return MismatchError(message)

    def announce_departure(self, reason: int) -> None:
        """Tell every rank that this one is leaving (shutdown or exit), but those gone already."""
        self.poll()
        self._notify(_LEFT, reason, [r for r in range(self.comm.size) if r not in self.left])

    def close(self) -> None:
        """Stop listening; let the notices this rank sent go out first (at most 1 s)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._inbox.close()

    # -- waiting ------------------------------------------------------------------------------

    def wait(
        self, request: MPI.Request, about: Callable[[], tuple], members: Sequence[int]
    ) -> None:
        """Wait for `request` of a collective among global ranks `members`.

        `about()` returns (what, identity): the collective's name for messages ("allreduce
        'w'") and a number that tells apart collectives ranks wait in (the digest of its
        fields), to find who is missing. It is called only once a wait is long.

        Raises:
            HorovodLiteError: a member left, or the wait passed the timeout (the job is then
                torn down).
        """
        if not request.Test():
            self._wait(lambda: request.Test() or None, about, members)

    def check_waiter(
        self, about: Callable[[], tuple], members: Sequence[int]
    ) -> Callable[[MPI.Request], None]:
        """Return `wait(request)` for the metadata check of a collective among global `members`.

        It tests the request without yielding for _SPIN_SECONDS where each rank of this host has
        a core (not at all where ranks outnumber cores), then waits as wait() (`about` as there).
        A closure, not a partial with keywords: this runs on every small all-reduce.
        """
        spin, wait = self._spin, self._wait

        def wait_check(request: MPI.Request) -> None:
            deadline = time.perf_counter() + spin
            while not request.Test():
                if time.perf_counter() > deadline:
                    wait(lambda: request.Test() or None, about, members)
                    return

        return wait_check

    def wait_any(self, requests: list, about: Callable[[], tuple], members: Sequence[int]) -> int:
        """Wait until one of `requests` completes; return its index. As wait() otherwise."""

        def first_done():
            return next((i for i, request in enumerate(requests) if request.Test()), None)

        done = first_done()
        return done if done is not None else self._wait(first_done, about, members)

    def _wait(self, test: Callable, about: Callable[[], tuple], members: Sequence[int]):
        """Call `test()` until it returns other than None; return that."""
        start = time.perf_counter()
        while time.perf_counter() - start < _YIELD_SECONDS:
            os.sched_yield()
            if (done := test()) is not None:
                return done
        # Long waits only from here on: the cost of the lines below no longer matters.
        delay, noticed, warned, marked, departure_seen = _FIRST_SLEEP, False, False, False, None
        what, identity = about()
        with self._lock:
            self._own[identity] = self._own.get(identity, 0) + 1
        try:
            while (done := test()) is None:
                time.sleep(delay)
                waited = time.perf_counter() - start
                delay = min(2 * delay, _MAX_SLEEP if waited < _LONG_WAIT else _LONG_SLEEP)
                self.poll()
                self._check_mismatch(what, identity)
                gone = [r for r in members if r in self.left]
                if gone:
                    departure_seen = departure_seen or time.perf_counter()
                    if time.perf_counter() - departure_seen > _DEPARTURE_GRACE:
                        message = self._departure_message(what, gone)
                        # This rank's half of the collective stays posted (MPI cannot cancel
                        # a collective), and MPI_Finalize would find its messages unreceived.
                        teardown_later(message)
                        raise HorovodLiteError(message)
                if not marked and waited > _MARK_AFTER and self._waiting_marker:
                    marked = _mark(self._waiting_marker, True)
                if not noticed and waited > min(_NOTICE_AFTER, self.timeout / 4):
                    noticed = True
                    self._notify(_WAITING, identity, members, what)
                if not warned and waited > self.stall_check:
                    warned = True
                    _log.warning(
                        "horovodlite stall: rank %d has waited %.0f s in %s; %s",
                        self.comm.rank,
                        waited,
                        what,
                        self._missing_text(identity, members),
                    )
                if waited > self.timeout:
                    message = (
                        f"{what} timed out after {self.timeout:g} s (HOROVODLITE_COLLECTIVE_"
                        f"TIMEOUT): {self._missing_text(identity, members)}; the job is torn down"
                    )
                    teardown_later(message)
                    raise HorovodLiteError(message)
            if noticed:  # the others learnt that this rank waits here: it no longer does
                self._notify(_DONE, identity, members)
        finally:  # also when the wait fails: this rank no longer waits
            with self._lock:
                self._own[identity] -= 1
            if marked:
                _mark(self._waiting_marker, False)
        return done

    def _check_mismatch(self, what: str, identity: int) -> None:
        with self._lock:
            holders = self._mismatched.pop(identity, None)
            crossed = self._crossed.pop(identity, None)
        if crossed:
            teardown_later(crossed)  # this rank's collective is still posted: the job cannot go on
            raise MismatchError(crossed)
        if holders:
            message = (
                f"{what}: {_ranks(sorted(holders))} submitted it asynchronously (an *_async call) "
                f"while rank {self.comm.rank} called it synchronously: every rank must call a "
                "collective the same way; the job is torn down"
            )
            teardown_later(message)  # this rank's check is still posted: the job cannot go on
            raise MismatchError(message)

    def _missing_text(self, identity: int, members: Sequence[int]) -> str:
        self.poll()
        arrived = self._waiting.get(identity, set()) | {self.comm.rank}
        missing = [r for r in members if r not in arrived]
        if not missing:
            return "every rank has arrived but the collective has not completed"
        return f"{_ranks(missing)} did not arrive"

    def _departure_message(self, what: str, gone: list) -> str:
        reasons = "; ".join(f"rank {r} {_REASONS.get(self.left[r], 'left')}" for r in gone)
        return (
            f"{what} cannot complete: {reasons} while rank {self.comm.rank} waited for it "
            "(every rank must call the same collectives before it shuts down or exits); the "
            "job is torn down"
        )


def _mark(path: str, present: bool) -> bool:
    """Create or remove the file `path`; return whether it was created. Never an error."""
    try:
        if present:
            open(path, "w").close()
        else:
            os.remove(path)
        return present
    except OSError:
        return False


class Inbox:
    """Small fixed-size notes with `tag` on `comm`: sending them, and one receive per sender.

    One receive posted per sender, not one from MPI.ANY_SOURCE: under MPICH over UCX
    (MPIR_CVAR_NOLOCAL=1, or ranks on several hosts) an any-source receive reposted while notes
    kept coming missed some, so an engine slept on while the others waited for it. A sender's
    notes arrive in the order it sent them.
    """

    def __init__(self, comm: MPI.Comm, tag: int, words: int):
        self._comm, self._tag = comm, tag
        self._sources = [r for r in range(comm.size) if r != comm.rank]
        self._buffers = [np.zeros(words, dtype=np.int64) for _ in self._sources]
        self._receives = [comm.Irecv(b, r, tag) for b, r in zip(self._buffers, self._sources)]
        self._sends: list = []

    def arrived(self) -> list:
        """Return copies of the notes that have arrived, each sender's in the order sent."""
        notes = []
        while self._receives and (done := MPI.Request.Testsome(self._receives)):
            for i in done:
                notes.append(self._buffers[i].copy())
                self._receives[i] = self._comm.Irecv(self._buffers[i], self._sources[i], self._tag)
        return notes

    def send(self, note: np.ndarray, ranks) -> None:
        """Send `note` to `ranks` (not to this rank): one small eager message each."""
        self._sends = [r for r in self._sends if not r.Test()]
        me = self._comm.rank
        self._sends += [self._comm.Isend(note.copy(), r, self._tag) for r in ranks if r != me]

    def close(self) -> None:
        """Let this rank's notes go out (for at most a second), then receive every note sent
        here, cancel the receives and drop what came.

        A message left unreceived at MPI_Finalize is harmless on MPICH over shared memory, a
        warning over UCX, and a hang or a crash on some other MPIs: none may be left behind.
        The ranks' last notes precede the engines' last negotiation (or reach a rank long
        before it leaves), so they have arrived here; a short quiet spell catches a late one.
        """
        deadline = time.monotonic() + 1.0
        while self._sends and time.monotonic() < deadline:
            self._sends = [r for r in self._sends if not r.Test()]
            time.sleep(1e-3)
        last = time.monotonic()
        while time.monotonic() - last < _QUIET:
            if self.arrived():
                last = time.monotonic()
            time.sleep(1e-3)
        for request in self._receives:
            request.Cancel()
        MPI.Request.Waitall(self._receives)
        self._receives = []


def _ranks(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


_teardown_started = threading.Event()


def teardown_later(message: str, delay: float = _TEARDOWN_DELAY) -> None:
    """Abort the whole job after `delay` seconds, unless this process has exited by then.

    The error that caused it is raised meanwhile, so the user's traceback can print; a daemon
    thread then tears the job down even where the error was caught.
    """
    if _teardown_started.is_set():
        return
    _teardown_started.set()

    def abort() -> None:
        time.sleep(delay)
        sys.stderr.write(f"horovodlite: {message}: aborting the job\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

    threading.Thread(target=abort, name="horovodlite-teardown", daemon=True).start()


def teardown_pending() -> bool:
    """Return whether a fatal error left a collective posted here and the job is torn down."""
    return _teardown_started.is_set()


def default_wait(request: MPI.Request) -> None:
    """Wait for `request` with no watch (a bare communicator, outside an initialized job)."""
    request.Wait()


def process_alive(pid: int) -> bool:
    """Return whether process `pid` of this host runs (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
