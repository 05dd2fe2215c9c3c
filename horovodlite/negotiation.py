"""How the engines agree, each cycle, on which requests to run: the message, and the full exchange.

Every cycle each rank's engine encodes one `Message`, a short uint8 array whose fields FIELDS
names, and the engines MIN-all-reduce it (engine.py). Read back, the MIN of every rank's message
says which cached requests every member holds (`held`, `held_flipped`), which ranks have joined
(`not_joined`) or are shutting down (`not_stopping`), and the cycle's status bits (`Status`): a
bit is 1 only where every rank set it. Horovod's CacheCoordinator plays this part, with its bits
in a StatusBit enum.

Where some rank holds a request the cache (agreed_cache.py) does not know, or knows with other
fields, or the stall inspector (stalls.py) asks for one, `ALL_CACHED` is 0 everywhere and the
ranks fall back to the `full_exchange` of every pending request's fields, which agrees on new
requests (the cache takes them), finds mismatches and tells which ranks each request misses.

This module owns the message's layout, its encoding and its decoding, and the full exchange.
"""

import enum
import functools

import numpy as np

from .agreement import FAILED, error_text, mismatch_message

__all__ = ["FIELDS", "Layout", "Message", "Status", "full_exchange"]


class Status(enum.IntEnum):
    """The status bits of a message, one byte each: after the MIN, 1 where every rank sent 1."""

    ALL_CACHED = 0  # every request pending here is in the cache with its agreed fields
    NOT_STALLED = 1  # none has waited past HOROVODLITE_STALL_SHUTDOWN_TIME_SECONDS
    NOT_TIMED_OUT = 2  # none has waited past HOROVODLITE_COLLECTIVE_TIMEOUT
    IDLE = 3  # nothing pending and not joined: the engines may sleep


# How long a field is: one byte per cached request, per rank, or per status bit.
PER_REQUEST, PER_RANK, PER_STATUS_BIT = "per cached request", "per rank", "per status bit"

# The message's fields, in order, and what one rank sends in each (MIN-reduced over the ranks):
#   held          2: holds the request with its agreed fields; 1: nothing to send (joined, or
#                 not in its process set); 0: not yet. MIN > 0: no member lacks it.
#   held_flipped  2 - held: its MIN is 2 - the MAX of `held`, so that one MIN-all-reduce also
#                 tells whether any rank holds it (MAX 2), not only that none lacks it.
#   not_joined    0 at this rank's own position once it has joined, else 1.
#   not_stopping  0 at this rank's own position once it is shutting down, else 1.
#   status        one byte per Status bit, 1 where it holds on this rank.
FIELDS = (
    ("held", PER_REQUEST),
    ("held_flipped", PER_REQUEST),
    ("not_joined", PER_RANK),
    ("not_stopping", PER_RANK),
    ("status", PER_STATUS_BIT),
)


class Layout:
    """Where each of FIELDS lies in the message of `requests` cached requests among `ranks`."""

    __slots__ = ("slices", "size")

    def __init__(self, requests: int, ranks: int):
        lengths = {PER_REQUEST: requests, PER_RANK: ranks, PER_STATUS_BIT: len(Status)}
        slices, start = [], 0
        for name, per in FIELDS:
            slices.append((name, slice(start, start + lengths[per])))
            start += lengths[per]
        self.slices = tuple(slices)  # (field name, where it lies), in order
        self.size = start  # bytes


@functools.lru_cache(maxsize=16)
def _layout(requests: int, ranks: int) -> Layout:
    """Return the layout for these counts, made once: the cache's size changes rarely."""
    return Layout(requests, ranks)


class Message:
    """One rank's negotiation message, or the MIN of every rank's: one uint8 array, by field."""

    __slots__ = ("layout", "vector") + tuple(name for name, _ in FIELDS)

    def __init__(self, layout: Layout, vector: np.ndarray = None):
        self.layout = layout
        self.vector = np.empty(layout.size, dtype=np.uint8) if vector is None else vector
        vector = self.vector
        for name, where in layout.slices:
            setattr(self, name, vector[where])

    @classmethod
    def encode(
        cls,
        held: np.ndarray,
        rank: int,
        ranks: int,
        *,
        joined: bool,
        stopping: bool,
        all_cached: bool,
        not_stalled: bool,
        not_timed_out: bool,
        idle: bool,
    ) -> "Message":
        """Return the message rank `rank` of `ranks` sends, with `held` from AgreedCache.offer."""
        message = cls(_layout(held.size, ranks))
        message.held[:] = held
        np.subtract(2, held, out=message.held_flipped)
        message.not_joined.fill(1)
        message.not_joined[rank] = not joined
        message.not_stopping.fill(1)
        message.not_stopping[rank] = not stopping
        status = message.status
        status[Status.ALL_CACHED] = all_cached
        status[Status.NOT_STALLED] = not_stalled
        status[Status.NOT_TIMED_OUT] = not_timed_out
        status[Status.IDLE] = idle
        return message

    def decode(self, vector: np.ndarray) -> "Message":
        """Return `vector`, the MIN of every rank's message laid out as this one, read by field."""
        return Message(self.layout, vector)

    def holds(self, bit: Status) -> bool:
        """Return whether the status bit `bit` is set (after the MIN: on every rank)."""
        return bool(self.status[bit])

    def highest(self) -> np.ndarray:
        """Return, per cached request, the MAX of every rank's `held` (read off `held_flipped`)."""
        return 2 - self.held_flipped

    def joined_ranks(self) -> set:
        """Return the ranks that have joined (after the MIN: each rank reports its own)."""
        return {rank for rank, byte in enumerate(self.not_joined.tolist()) if byte == 0}

    def stopping_ranks(self) -> list:
        """Return the ranks that are shutting down, in order."""
        return [rank for rank, byte in enumerate(self.not_stopping.tolist()) if byte == 0]


def full_exchange(comm, pending: dict, cache, ranks_of, joined_ranks: set) -> tuple:
    """Exchange every pending request's fields among `comm`'s ranks; agree on the complete ones.

    A request is complete where every member of its process set (`ranks_of(process set id)`,
    None where the set is unknown) has submitted it or has joined. Complete requests with one
    digest enter `cache`; with several, or an argument error on some rank, they fail.

    Returns:
        (ready keys in cache order, {key: error message}, {key: ranks missing it}), the same on
        every rank; the last in the order of the requests, rank 0's first.
    """
    mine = [
        (key, r.fingerprint, r.plan.fields, error_text(r.plan.error)) for key, r in pending.items()
    ]
    submitted: dict = {}
    for rank, items in enumerate(comm.allgather(mine)):
        for key, fingerprint, fields, error in items:
            submitted.setdefault(key, {})[rank] = (fingerprint, fields, error)
    cache.clear_if_full()
    ready, errors, missing = [], {}, {}
    # In submission order, rank 0's first, so that the cache orders them so (fusion.adjacent_span).
    for key, by_rank in submitted.items():
        ranks = ranks_of(key[0])
        if ranks is None:
            errors[key] = f"process set {key[0]} is not registered on every rank"
            continue
        absent = [r for r in ranks if r not in by_rank and r not in joined_ranks]
        if absent:
            missing[key] = absent
            continue
        fingerprints = {fingerprint for fingerprint, _, _ in by_rank.values()}
        if len(fingerprints) > 1 or FAILED in fingerprints:
            errors[key] = mismatch_message(
                [(r, fields, error) for r, (_, fields, error) in sorted(by_rank.items())]
            )
            continue
        fingerprint, fields, _ = next(iter(by_rank.values()))
        own = pending.get(key)  # its fields object: see Request.matches
        cache.agreed(key, fingerprint, fields if own is None else own.plan.fields, ranks)
        ready.append(key)
    ready.sort(key=lambda k: cache.entries[k].index)
    return ready, errors, missing
