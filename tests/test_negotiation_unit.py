"""Single-process unit tests of the engine's negotiation (negotiation.py): the message's layout,
each of its fields as several ranks encode it and the MIN of them reads back, and the full
exchange. Several ranks are simulated: their vectors are MIN-reduced with numpy, as
MPI_Allreduce(MIN) would."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from horovodlite.agreed_cache import AgreedCache
from horovodlite.agreement import FAILED, digest
from horovodlite.handles import Request
from horovodlite.negotiation import FIELDS, Layout, Message, Status, full_exchange
from horovodlite.plan import Plan

RANKS = 3


def encode(rank: int, held=(), **given) -> Message:
    """Return rank `rank`'s message: not joined, not stopping, every bit set, unless given."""
    options = dict(joined=False, stopping=False, all_cached=True, not_stalled=True,
                   not_timed_out=True, idle=True)  # fmt: skip
    options.update(given)
    return Message.encode(np.array(held, dtype=np.uint8), rank, RANKS, **options)


def reduced(messages: list) -> Message:
    """Return the MIN of `messages`, read back by field, as every rank reads it."""
    return messages[0].decode(np.minimum.reduce([m.vector for m in messages]))


def test_the_layout_places_the_fields_in_order_without_gaps():
    layout = Layout(requests=3, ranks=4)
    lengths = {"held": 3, "held_flipped": 3, "not_joined": 4, "not_stopping": 4, "status": 4}
    start = 0
    assert [name for name, _ in layout.slices] == [name for name, _ in FIELDS]
    for name, _ in FIELDS:
        assert dict(layout.slices)[name] == slice(start, start + lengths[name]), name
        start += lengths[name]
    assert layout.size == start == 18 and len(Status) == 4


def test_every_field_is_a_view_of_the_one_vector_that_travels():
    message = encode(1, held=[2, 0])
    assert message.vector.dtype == np.uint8 and message.vector.flags.c_contiguous
    for name, _ in FIELDS:
        assert np.shares_memory(getattr(message, name), message.vector), name


def test_held_reads_as_the_lowest_byte_of_every_rank():
    # Three cached requests: every rank holds the first; the second is nobody's to send
    # (1 everywhere); rank 2 lacks the third.
    messages = [encode(0, [2, 1, 2]), encode(1, [2, 1, 2]), encode(2, [2, 1, 0])]
    assert encode(0, [2, 1, 2]).held.tolist() == [2, 1, 2]
    assert reduced(messages).held.tolist() == [2, 1, 0]


def test_held_flipped_reads_as_the_highest_byte_of_every_rank():
    messages = [encode(0, [2, 1, 2]), encode(1, [1, 1, 2]), encode(2, [1, 1, 0])]
    assert encode(1, [1, 1, 2]).held_flipped.tolist() == [1, 1, 0]  # 2 - held
    agreed = reduced(messages)
    assert agreed.highest().tolist() == [2, 1, 2]
    # Ready: no member lacks it (MIN > 0) and some rank sends it (MAX 2): only the first.
    cache = AgreedCache(rank=0)
    for name in "abc":
        cache.agreed((0, name), 1, {"name": name}, (0, 1, 2))
    assert cache.ready(agreed.held, agreed.highest()) == [(0, "a")]


def test_not_joined_names_the_ranks_that_joined():
    assert encode(1, joined=True).not_joined.tolist() == [1, 0, 1]  # its own position only
    assert reduced([encode(r) for r in range(RANKS)]).joined_ranks() == set()
    messages = [encode(0, joined=True), encode(1), encode(2, joined=True)]
    assert reduced(messages).joined_ranks() == {0, 2}


def test_not_stopping_names_the_ranks_that_shut_down():
    assert encode(2, stopping=True).not_stopping.tolist() == [1, 1, 0]
    assert reduced([encode(r) for r in range(RANKS)]).stopping_ranks() == []
    messages = [encode(0), encode(1, stopping=True), encode(2, joined=True)]
    agreed = reduced(messages)
    assert agreed.stopping_ranks() == [1] and agreed.joined_ranks() == {2}


@pytest.mark.parametrize("bit", list(Status), ids=lambda bit: bit.name)
def test_each_status_bit_holds_only_where_every_rank_sets_it(bit):
    keyword = bit.name.lower()
    assert encode(0).holds(bit) and not encode(0, **{keyword: False}).holds(bit)
    assert reduced([encode(r) for r in range(RANKS)]).holds(bit)
    agreed = reduced([encode(0), encode(1, **{keyword: False}), encode(2)])
    assert not agreed.holds(bit)
    assert all(agreed.holds(other) for other in Status if other != bit)  # the others untouched


def test_a_message_travels_in_one_mpi_min_all_reduce():
    message = encode(0, [2, 1, 0], joined=True, idle=False)
    out = np.empty_like(message.vector)
    MPI.COMM_SELF.Iallreduce(message.vector, out, op=MPI.MIN).Wait()
    agreed = message.decode(out)
    assert agreed.held.tolist() == [2, 1, 0] and agreed.highest().tolist() == [2, 1, 0]
    assert agreed.joined_ranks() == {0} and not agreed.holds(Status.IDLE)


# -- the full exchange -----------------------------------------------------------------------


class _Gathered:
    """A stand-in communicator whose allgather returns what every rank sent, rank by rank."""

    def __init__(self, everyone: list):
        self.everyone = everyone

    def allgather(self, mine):
        return [mine, *self.everyone[1:]]  # rank 0 is this rank


def request(name: str, shape=(3,), error=None) -> Request:
    fields = {"collective": "allreduce", "name": name, "shape": shape}
    return Request(Plan(fields, 0, None, error=error), (0, name), time.monotonic())


def items(*requests) -> list:
    return [(r.key, r.fingerprint, r.plan.fields, None) for r in requests]


def test_the_full_exchange_agrees_on_complete_requests_in_rank_0s_order():
    pending = {r.key: r for r in (request("b"), request("a"))}
    others = items(request("a"), request("b"))  # another order on rank 1
    cache = AgreedCache(rank=0)
    ready, errors, missing = full_exchange(
        _Gathered([None, others]), pending, cache, lambda _: (0, 1), set()
    )
    assert ready == [(0, "b"), (0, "a")] and errors == {} and missing == {}
    assert cache.entries[(0, "b")].index == 0 and cache.entries[(0, "a")].index == 1
    # This rank's own fields object is kept, so a repeated request matches by identity.
    assert cache.entries[(0, "a")].fields is pending[(0, "a")].plan.fields


def test_the_full_exchange_tells_which_ranks_each_request_misses():
    pending = {(0, "lonely"): request("lonely")}
    comm = _Gathered([None, [], []])
    ready, _, missing = full_exchange(comm, pending, AgreedCache(0), lambda _: (0, 1, 2), set())
    assert ready == [] and missing == {(0, "lonely"): [1, 2]}
    # A joined rank misses nothing: it contributes zeros.
    ready, _, missing = full_exchange(comm, pending, AgreedCache(0), lambda _: (0, 1, 2), {1, 2})
    assert ready == [(0, "lonely")] and missing == {}


def test_the_full_exchange_fails_mismatches_argument_errors_and_unknown_sets():
    pending = {r.key: r for r in (request("w"), request("bad", error=ValueError("no")))}
    assert pending[(0, "bad")].fingerprint == FAILED
    others = items(request("w", shape=(4,)), request("bad"))
    ready, errors, _ = full_exchange(
        _Gathered([None, others]), pending, AgreedCache(0), lambda _: (0, 1), set()
    )
    assert ready == [] and set(errors) == {(0, "w"), (0, "bad")}
    assert "rank 0 sent shape (3,), rank 1 sent (4,)" in errors[(0, "w")]
    assert "rank 0 failed before sending: ValueError: no" in errors[(0, "bad")]
    _, errors, _ = full_exchange(
        _Gathered([None, items(request("w"))]), pending, AgreedCache(0), lambda _: None, set()
    )
    assert errors[(0, "w")] == "process set 0 is not registered on every rank"


def test_a_request_agreed_once_is_offered_by_one_byte_with_its_digest():
    mine = request("w")
    cache = AgreedCache(rank=0)
    full_exchange(_Gathered([None, items(request("w"))]), {mine.key: mine}, cache,
                  lambda _: (0, 1), set())  # fmt: skip
    held, all_cached = cache.offer({mine.key: mine}, joined=False)
    assert held.tolist() == [2] and all_cached
    assert cache.entries[mine.key].fingerprint == digest(mine.plan.fields)
