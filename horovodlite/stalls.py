"""Asynchronous requests that wait too long: the stall warning, and why the engines stop.

A request that some ranks submitted and others did not waits; the engine's full exchange finds
which ranks it misses (engine.py). Past HOROVODLITE_STALL_CHECK_TIME_SECONDS the engine warns,
past HOROVODLITE_STALL_SHUTDOWN_TIME_SECONDS (where set) it stops on every rank, and past
HOROVODLITE_COLLECTIVE_TIMEOUT it stops and the job is torn down. This module words them.
"""

import logging

from .waiting import teardown_later

__all__ = ["warn_of_stalls", "stall_shutdown_message", "timeout_message"]

_log = logging.getLogger("horovodlite")


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
