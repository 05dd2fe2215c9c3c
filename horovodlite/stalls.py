"""Asynchronous requests that wait too long: found, warned of, and stopped (the StallInspector).

A request that some ranks submitted and others did not waits; the engine's full exchange tells
which ranks each misses (negotiation.py), and the inspector remembers since when. Past
HOROVODLITE_STALL_CHECK_TIME_SECONDS the inspector asks for full exchanges and warns, once per
period; past HOROVODLITE_STALL_SHUTDOWN_TIME_SECONDS (where set) the engines stop on every rank,
and past HOROVODLITE_COLLECTIVE_TIMEOUT they stop and the job is torn down. It also finds the
requests that can never meet their peers: ranks blocked in a synchronous collective on the same
digest, or missing a request that this rank waits for in synchronize() (the Watch, waiting.py,
knows who waits where).

This module owns those times and the ranks each request misses, and words the warning and the
errors. The engine acts on its answers: it fails the requests, or stops.
"""

import logging

from .agreement import FAILED, describe
from .waiting import teardown_later

__all__ = ["StallInspector", "warn_of_stalls", "stall_shutdown_message", "timeout_message"]

_log = logging.getLogger("horovodlite")

_MEETING_CHECK = 1.0  # seconds pending before a request is checked against synchronous waiters
_RECHECK = 0.25  # seconds between full exchanges that tell who a waited-for request misses
# Seconds in synchronize() before a request is checked against ranks blocked in a synchronous
# collective: another thread of theirs might still submit it, late on a loaded machine.
_CROSSED_CHECK = 2.0


def _age(pending: dict, now: float) -> float:
    """Return how long the oldest of `pending` has waited (0 if none)."""
    for request in pending.values():  # in submission order (Engine.submit)
        return now - request.submitted
    return 0.0


class StallInspector:
    """Watches one engine's pending requests: which ranks each misses, since when, and for how long.

    The engine asks it before each negotiation (`unmet`, `inspect`), after each full exchange
    (`exchanged`, `crossed`), and tells it which requests run (`ran`).
    """

    def __init__(self, settings, watch, rank: int):
        # Tunables, copied from the settings once.
        self.stall_check = settings.stall_check
        self.stall_shutdown = settings.stall_shutdown
        self.timeout = settings.collective_timeout
        self.missing: dict = {}  # key -> ranks the last full exchange found missing
        self._first_seen: dict = {}  # key -> when a full exchange first found it incomplete
        self._last_report = self._last_recheck = 0.0
        self._watch, self._rank = watch, rank

    def unmet(self, pending: dict, now: float) -> list:
        """Return (key, error) for requests that other ranks wait for in a synchronous call.

        The two run on different communicators and never meet: the Watch tells, from their
        notices, whether ranks wait synchronously on a request's digest.
        """
        if _age(pending, now) <= _MEETING_CHECK:
            return []  # most cycles: every request is younger
        failed = []
        for key, request in pending.items():
            if now - request.submitted > _MEETING_CHECK and request.fingerprint != FAILED:
                what = describe(request.plan.fields)
                error = self._watch.held_async(request.fingerprint, what)
                if error is not None:
                    failed.append((key, error))
        return failed

    def inspect(self, pending: dict, now: float) -> tuple:
        """Return (whether to force a full exchange, stalled, timed out) for a negotiation.

        A full exchange tells who is missing: once per stall check period (or half the timeout)
        while a request waits that long, and every _RECHECK s while a thread waits for one
        (`crossed`). Stalled: past the stall shutdown time; timed out: past the timeout.
        """
        age = _age(pending, now)
        recheck = False
        if age > _MEETING_CHECK:
            waited = min((r.waited for r in pending.values() if r.waited), default=now)
            if now - waited > _MEETING_CHECK and now - self._last_recheck > _RECHECK:
                recheck, self._last_recheck = True, now
        check_after = min(self.stall_check, self.timeout / 2)
        due = age > check_after and now - self._last_report > check_after
        stalled = self.stall_shutdown > 0 and age > self.stall_shutdown
        return recheck or due, stalled, age > self.timeout

    def exchanged(self, missing: dict, pending: dict, now: float) -> None:
        """Take `missing` ({key: ranks}) from a full exchange; warn of those missing too long.

        The warning comes once per stall check period, not once per cycle: on rank 0, and on
        every rank that holds one of the late requests.
        """
        first_seen = self._first_seen
        self._first_seen = {key: first_seen.get(key, now) for key in missing}
        self.missing = missing
        late = [
            (key, ranks)
            for key, ranks in missing.items()
            if now - self._first_seen[key] > self.stall_check
        ]
        if not late or now - self._last_report < self.stall_check:
            return
        self._last_report = now
        if self._rank == 0 or any(key in pending for key, _ in late):
            warn_of_stalls(late, self.stall_check)

    def ran(self, keys: list) -> None:
        """Forget what is known of `keys`, which every member now holds."""
        if self.missing or self._first_seen:
            for key in keys:
                self.missing.pop(key, None)
                self._first_seen.pop(key, None)

    def crossed(self, pending: dict, now: float) -> list:
        """Return (key, error) for requests waited for here that ranks blocked in a synchronous
        collective miss: neither side can go on."""
        if not self.missing:
            return []
        failed = []
        for key, request in pending.items():
            missing = self.missing.get(key)
            if missing and request.waited is not None and now - request.waited > _CROSSED_CHECK:
                error = self._watch.crossed(describe(request.plan.fields), missing)
                if error is not None:
                    failed.append((key, error))
        return failed

    def stop_message(self, timed_out: bool, pending: dict) -> str:
        """Return why the engines stop: a request timed out, else one stalled."""
        names = sorted(str(key[1]) for key in pending)
        if timed_out:
            return timeout_message(self.timeout, list(self.missing.items()), names)
        return stall_shutdown_message(self.stall_shutdown, names)


def _who_is_missing(missing: list) -> str:
    return "; ".join(f"{key[1]!r} is missing ranks {ranks}" for key, ranks in missing)


def warn_of_stalls(late: list, stall_check: float) -> None:
    """Log the requests `late` ((key, missing ranks) pairs) that some ranks never submitted."""
    _log.warning(
        "horovodlite stall: for over %.0f s these collectives have been submitted by some "
        "ranks but not others: %s. Every rank must submit the same collectives.",
        stall_check,
        _who_is_missing(late),
    )


def stall_shutdown_message(stall_shutdown: float, pending: list) -> str:
    """Return why the engines stop: a request stalled over `stall_shutdown` seconds."""
    return (
        f"horovodlite stopped: a collective stalled for over {stall_shutdown:.0f} s "
        f"(HOROVODLITE_STALL_SHUTDOWN_TIME_SECONDS); pending here: {pending}"
    )


def timeout_message(timeout: float, missing: list, pending: list) -> str:
    """Return why the engines stop after a request waited `timeout` s; tear the job down soon."""
    message = (
        f"an asynchronous collective waited over {timeout:g} s (HOROVODLITE_COLLECTIVE_TIMEOUT): "
        f"{_who_is_missing(missing) or 'no rank is missing'}; pending here: {pending}; the job "
        "is torn down"
    )
    teardown_later(message)  # even where the error is caught: no rank may wait forever
    return message
