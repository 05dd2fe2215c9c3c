"""Agreement on a collective's metadata before any data moves.

Every rank hashes what it is about to do (collective, name, dtype, shape, root, op, ...) and the
ranks compare the hashes in one small Allgather of fixed-size records (`exchange`). If the hashes
differ, or a rank found its own arguments bad, the ranks exchange the full metadata and every rank
raises: the rank at fault its own TypeError/ValueError, the others a MismatchError naming the
ranks and values. So a mistake on one rank becomes an exception on all ranks instead of a hang or
silently wrong data.

A record is [digest, payload, room for a small tensor]. The payload is one integer that may
differ per rank by design (allgather's row count). The room lets a small all-reduce travel in the
check itself, so it costs one message instead of two (collectives.py). Records have one size on
every rank whatever the arguments, because MPI needs equal counts even when the ranks disagree:
that is why every check, whichever collective it guards, is this same call.
"""

import hashlib
import math
import threading
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

from .buffers import DTYPE_NAMES
from .exceptions import HorovodLiteError, MismatchError
from .waiting import default_wait

__all__ = [
    "FAILED",
    "JOINABLE",
    "JOINED",
    "agree",
    "all_agree",
    "array_fields",
    "bind",
    "describe",
    "digest",
    "error_text",
    "exchange",
    "exchange_with_data",
    "explain",
    "inline_bytes",
    "joined_fields",
    "mismatch_message",
    "post_joined",
    "release",
    "same_everywhere",
]

FAILED = 0  # the digest a rank sends when its own arguments were bad

# All ranks' tensor rooms together hold this much, so a check never moves more than about 4 KiB:
# 2 KiB per rank at 2 ranks, 1 KiB at 4, nothing beyond 512 ranks. Gathering 4 KiB costs about
# as much as all-reducing 16 bytes on shared memory (docs/benchmarks.md, small messages).
INLINE_BUDGET_BYTES = 4096


def array_fields(collective: str, name, array, *, trailing: bool = False, **extra) -> dict:
    """Return what every rank must submit alike for `collective` on `array`, plus `extra`.

    `trailing` compares the shape past dimension 0 only (for collectives whose row counts may
    differ between ranks).
    """
    fields = {"collective": collective, "name": name, "dtype": DTYPE_NAMES[array.dtype]}
    if trailing:
        fields["trailing_shape"] = tuple(array.shape[1:])
    else:
        fields["shape"] = tuple(array.shape)
    return {**fields, **extra}


def inline_bytes(size: int) -> int:
    """Return the room for tensor data in each record of a check among `size` ranks."""
    return INLINE_BUDGET_BYTES // size // 8 * 8


class _Records:
    """The send record and every rank's records for one group size, reused call after call.

    `check` is their persistent all-gather on the communicator they are bound to (bind()), else
    None: each check then posts an all-gather of its own.
    """

    def __init__(self, size: int):
        words = 2 + inline_bytes(size) // 8
        self.own = np.zeros(words, dtype=np.int64)
        self.everyone = np.empty((size, words), dtype=np.int64)
        self.digests = self.everyone[:, 0]
        self.payloads = self.everyone[:, 1]
        self.check: Optional[MPI.Prequest] = None
        self._views: dict = {}

    def views(self, dtype, shape: tuple) -> tuple:
        """Return (this rank's room as an array of `shape` and `dtype`, every rank's room flat),
        made once: a small all-reduce is bound by latency, and making numpy views costs about
        as much as MPICH's whole call."""
        found = self._views.get((dtype, shape))
        if found is None:
            if len(self._views) > 256:
                self._views.clear()
            count = math.prod(shape)
            room = self.own[2:].view(dtype)[:count].reshape(shape)
            rows = tuple(self.everyone[:, 2:].view(dtype)[:, :count])
            found = self._views[(dtype, shape)] = (room, rows)
        return found

    def gather(self, comm) -> MPI.Request:
        """Start gathering every rank's record on `comm`; return the request to wait for."""
        if self.check is None:
            return comm.Iallgather(self.own, self.everyone)
        self.check.Start()
        return self.check


# The records of the communicators bound by bind(), by handle. Any other communicator's checks
# use records per thread and group size, as calls may come from any thread.
_bound: dict = {}
_local = threading.local()


def bind(comm) -> None:
    """Make every check on `comm` start one persistent all-gather (MPI 4), set up here: an
    all-gather posted per check costs half as much again (docs/benchmarks.md, "Figures behind
    the code's constants").

    Collective: every rank binds `comm` right after making it, and calls release(comm) before
    freeing it. On `comm` one check runs at a time, as MPI's collective order already asks. An
    MPI library without persistent collectives keeps an all-gather per check.
    """
    if comm.size == 1:
        return
    records = _Records(comm.size)
    try:
        records.check = comm.Allgather_init(records.own, records.everyone)
    except NotImplementedError:
        return
    _bound[comm.handle] = records


def release(comm) -> None:
    """Undo bind(comm), before `comm` is freed. A check that failed and is still posted is left
    as it is (MPI cannot free it; the job is being torn down: waiting.teardown_later)."""
    records = _bound.pop(comm.handle, None)
    if records is not None and records.check.Test():
        records.check.Free()


def _records(comm) -> _Records:
    records = _bound.get(comm.handle)
    if records is not None:
        return records
    by_size = getattr(_local, "records", None)
    if by_size is None:
        by_size = _local.records = {}
    records = by_size.get(comm.size)
    if records is None:
        records = by_size[comm.size] = _Records(comm.size)
    return records


# wait(request): block until an MPI request completes (waiting.Watch.check_waiter's, which never
# waits forever; default_wait outside an initialized job).
Wait = Callable


def exchange(comm, own: int, payload: int = 0, wait: Wait = default_wait) -> tuple:
    """Gather every rank's digest and payload; return (digests, payloads), lists in rank order."""
    if comm.size == 1:  # nobody to disagree with: no message (a set of one, or a one-rank job)
        return [own], [payload]
    records = _records(comm)
    records.own[0] = own
    records.own[1] = payload
    wait(records.gather(comm))
    return records.digests.tolist(), records.payloads.tolist()


def exchange_with_data(comm, own: int, data: np.ndarray, wait: Wait = default_wait):
    """Gather every rank's digest and `data` (at most inline_bytes(comm.size) bytes).

    Returns:
        a tuple of every rank's data, flat, in rank order, or None if the digests differ.
        The arrays are reused by the next exchange on `comm` (or on this thread, where `comm` is
        not bound): read them before then.
    """
    if comm.size == 1:
        return (data.reshape(-1),) if own != FAILED else None
    records = _records(comm)
    room, rows = records.views(data.dtype, data.shape)
    room[...] = data
    records.own[0] = own
    wait(records.gather(comm))
    return rows if all_agree(records.digests.tolist()) else None


def all_agree(digests: list) -> bool:
    return digests[0] != FAILED and digests.count(digests[0]) == len(digests)


_digests: dict = {}  # fields -> digest; training loops repeat the same few collectives


def digest(fields: dict) -> int:
    """Return a 62-bit hash of `fields`, the same in every process (never FAILED)."""
    key = tuple(fields.items())
    value = _digests.get(key)
    if value is None:
        raw = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
        value = (int.from_bytes(raw, "little") & (2**62 - 1)) or 1
        if len(_digests) > 65536:
            _digests.clear()
        _digests[key] = value
    return value


def describe(fields: dict) -> str:
    """Return "allreduce 'name'" for messages."""
    name = fields.get("name")
    kind = fields.get("collective", "collective")
    return f"{kind} {name!r}" if name is not None else f"{kind} (unnamed)"


def _ranks(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def mismatch_message(infos: list) -> str:
    """Explain which ranks disagree on what, the rarest values first.

    `infos` holds (rank, fields, error message or None) for every rank that submitted.
    """
    header = describe(infos[0][1])
    if len({describe(fields) for _, fields, _ in infos}) > 1:
        names = {fields.get("name") for _, fields, _ in infos}
        # The engine matches requests by name: keep it when only the kind of collective differs.
        kinds = {fields.get("collective") for _, fields, _ in infos}
        single = len(names) == 1 and None not in names
        header = f"collective {names.pop()!r}" if single else "collective"
        if not single and len(kinds) == 1:  # only the names differ: keep the kind
            header = str(kinds.pop())
    problems = [
        f"{_ranks([r])} failed before sending: {error}"
        for r, _, error in infos
        if error is not None
    ]
    keys = sorted({k for _, fields, error in infos if error is None for k in fields})
    for key in keys:
        groups: dict = {}
        for r, fields, error in infos:
            if error is None:
                groups.setdefault(repr(fields.get(key)), []).append(r)
        if len(groups) > 1:
            ordered = sorted(groups.items(), key=lambda item: (len(item[1]), item[1]))
            parts = [f"{_ranks(ordered[0][1])} sent {key} {ordered[0][0]}"]
            parts += [f"{_ranks(ranks)} sent {value}" for value, ranks in ordered[1:]]
            problems.append(", ".join(parts))
    return (
        f"{header}: " + "; ".join(problems) + " (every rank must call the same collectives, in the "
        "same order, with matching arguments)"
    )


def agree(
    comm,
    fields: dict,
    error: Exception = None,
    payload: int = None,
    *,
    check: bool = True,
    ranks: Optional[Sequence[int]] = None,
    wait: Wait = default_wait,
):
    """Check that all ranks of `comm` submit the same `fields`; return every rank's `payload`.

    `payload` is one integer that may differ per rank by design (allgather's first dimension);
    when given, the returned list holds every rank's, else None is returned. With `check` off
    (HOROVODLITE_CHECK_METADATA=0) only the payloads travel. `ranks` are the global ranks of
    `comm`'s members, for messages (default: the ranks of `comm` itself). `wait(request)` waits
    for the exchange (the state's Watch, which never waits forever).

    Raises:
        `error` on the rank that passed one; MismatchError on every other rank when any rank
        passed an error or the fields differ; HorovodLiteError where ranks have joined and the
        collective cannot run beside them (explain()).
    """
    if not check:
        if error is not None:
            raise error
        if payload is None:
            return None
        payloads = np.empty(comm.size, dtype=np.int64)
        wait(comm.Iallgather(np.array([payload], dtype=np.int64), payloads))
        return payloads.tolist()
    own = FAILED if error is not None else digest(fields)
    digests, payloads = exchange(comm, own, 0 if payload is None else payload, wait)
    if all_agree(digests):
        return None if payload is None else payloads
    explain(comm, fields, error, ranks)  # returns only beside joined ranks, for JOINABLE ones
    return None


def same_everywhere(comm, own: int, wait: Wait = default_wait) -> bool:
    """Return whether every rank of `comm` sent the digest `own` (and none sent FAILED).

    Every rank gets the same answer, so on False all of them go on to explain().
    """
    digests, _ = exchange(comm, own, 0, wait)
    return all_agree(digests)


def explain(
    comm, fields: dict, error: Exception = None, ranks: Optional[Sequence[int]] = None
) -> list:
    """After a failed check: gather every rank's fields, then raise, or go on beside joined ranks.

    `ranks` are the global ranks of `comm`'s members: a process set's own ranks would mislead.
    Ranks in hvd.join() take part in every check (`joined_fields`). Where all other ranks agree
    on a collective that joined ranks can answer (JOINABLE: they contribute zeros to an
    all-reduce, arrive at a barrier), the collective goes on: this returns the global ranks
    that have joined, and the caller runs it the general way, as the joined ranks do.

    Raises:
        `error` on a rank that passed one, MismatchError naming ranks and values on the others,
        HorovodLiteError where ranks have joined and the collective cannot run beside them.
    """
    infos = comm.allgather((fields, error_text(error)))
    if error is not None:
        raise error
    ranks = range(comm.size) if ranks is None else ranks
    joined = [ranks[r] for r, (f, _) in enumerate(infos) if f == _JOINED_INFO]
    active = [(ranks[r], f, e) for r, (f, e) in enumerate(infos) if f != _JOINED_INFO]
    disagree = len({repr(sorted(f.items())) for _, f, _ in active}) > 1
    if not joined or disagree or any(e for _, _, e in active):
        raise MismatchError(mismatch_message(active))
    if fields.get("collective") in JOINABLE:
        return joined
    raise HorovodLiteError(
        f"{describe(fields)}: {_ranks(joined)} {'has' if len(joined) == 1 else 'have'} joined: "
        f"{fields.get('collective')} is not supported with join (only allreduce and barrier "
        "are: joined ranks contribute zeros)"
    )


# -- join: the side of a rank in hvd.join() ----------------------------------------------------

JOINED = 2**62 + 1  # the digest of a rank in join(): no fields digest (< 2**62) equals it
JOINABLE = frozenset({"allreduce", "grouped_allreduce", "barrier"})
_JOINED_INFO = "joined"  # what a joined rank sends where others send their fields


def post_joined(comm) -> tuple:
    """Post a joined rank's part of the next check on `comm`; return (request, records).

    The records are `comm`'s bound ones, whose persistent all-gather the other ranks' checks
    start (MPI matches a persistent collective only with its like), else this call's own, as a
    joined rank waits on several communicators at once.
    """
    records = _bound.get(comm.handle) or _Records(comm.size)
    records.own[:] = 0
    records.own[0] = JOINED
    return records.gather(comm), records


def joined_fields(comm):
    """Take a joined rank's part in explain(); return the fields the other ranks agreed on.

    Returns None where they disagree or the collective is not JOINABLE: they raise, and the
    joined rank has nothing to run.
    """
    infos = comm.allgather((_JOINED_INFO, None))
    active = [(f, e) for f, e in infos if f != _JOINED_INFO]
    if any(e for _, e in active) or len({repr(sorted(f.items())) for f, _ in active}) != 1:
        return None
    fields = active[0][0]
    return fields if fields.get("collective") in JOINABLE else None


def error_text(error) -> str:
    """Return "TypeError: message" for an argument error, or None."""
    return None if error is None else f"{type(error).__name__}: {error}"
