"""Single-process unit tests of the engine's parts by concern: the stall inspector (stalls.py),
join's bookkeeping (join_ledger.py) and the fusion buckets (buckets.py)."""

import logging
import types

import numpy as np
import pytest

from horovodlite import stalls
from horovodlite.buckets import into_batches
from horovodlite.join_ledger import JoinLedger, refused_beside
from horovodlite.stalls import StallInspector

# -- the stall inspector -----------------------------------------------------------------------


class _Watch:
    """A stand-in for the state's Watch: every rank it is asked about waits synchronously."""

    def __init__(self):
        self.asked = []

    def held_async(self, fingerprint, what):
        self.asked.append(("held_async", what))
        return RuntimeError(f"{what} never meets")

    def crossed(self, what, missing):
        self.asked.append(("crossed", what, missing))
        return RuntimeError(f"{what} crossed {missing}")


def inspector(rank=0, stall_check=60.0, stall_shutdown=0.0, timeout=600.0) -> StallInspector:
    settings = types.SimpleNamespace(
        stall_check=stall_check, stall_shutdown=stall_shutdown, collective_timeout=timeout
    )
    return StallInspector(settings, _Watch(), rank)


def pending_request(name: str, submitted: float, waited=None):
    plan = types.SimpleNamespace(fields={"collective": "allreduce", "name": name}, error=None)
    request = types.SimpleNamespace(plan=plan, submitted=submitted, waited=waited, fingerprint=7)
    return (0, name), request


def test_young_requests_need_no_full_exchange_and_neither_stall_nor_time_out():
    watcher = inspector(stall_shutdown=5.0, timeout=10.0)
    pending = dict([pending_request("a", 100.0)])
    assert watcher.inspect(pending, 100.5) == (False, False, False)
    assert watcher.inspect({}, 100.5) == (False, False, False)
    assert watcher.unmet(pending, 100.5) == [] and watcher._watch.asked == []


def test_an_old_request_asks_for_a_full_exchange_then_stalls_then_times_out():
    watcher = inspector(stall_check=2.0, stall_shutdown=5.0, timeout=10.0)
    pending = dict([pending_request("a", 100.0)])
    assert watcher.inspect(pending, 102.5) == (True, False, False)  # past the stall check
    assert watcher.inspect(pending, 105.5) == (True, True, False)  # past the stall shutdown
    assert watcher.inspect(pending, 110.5) == (True, True, True)  # past the timeout
    # Half the timeout asks for a full exchange where it comes before the stall check.
    assert inspector(stall_check=60.0, timeout=4.0).inspect(pending, 102.5)[0]


def test_a_waited_for_request_asks_every_recheck_who_misses_it():
    watcher = inspector()
    pending = dict([pending_request("a", 100.0, waited=100.0)])
    assert watcher.inspect(pending, 101.5)[0]
    assert not watcher.inspect(pending, 101.6)[0]  # within _RECHECK of the last
    assert watcher.inspect(pending, 101.8)[0]


def test_the_stall_warning_comes_once_per_period_after_the_stall_check(caplog):
    watcher = inspector(stall_check=2.0)
    key, request = pending_request("lonely", 100.0)
    missing = {key: [2]}
    with caplog.at_level(logging.WARNING, logger="horovodlite"):
        watcher.exchanged(missing, {key: request}, 100.0)  # first seen now: not yet late
        assert caplog.records == [] and watcher.missing == missing
        watcher.exchanged(missing, {key: request}, 102.5)
        assert len(caplog.records) == 1
        assert "'lonely' is missing ranks [2]" in caplog.records[0].getMessage()
        watcher.exchanged(missing, {key: request}, 103.0)  # within the period: silent
        assert len(caplog.records) == 1
        # A rank other than 0 that does not hold the request stays silent.
        other = inspector(rank=1, stall_check=2.0)
        other.exchanged(missing, {}, 100.0)
        other.exchanged(missing, {}, 103.0)
        assert len(caplog.records) == 1
    # Once it runs it is forgotten: a later stall of the same name starts its own clock.
    watcher.ran([key])
    assert watcher.missing == {} and watcher._first_seen == {}


def test_requests_that_never_meet_their_peers_are_named_to_the_engine():
    watcher = inspector()
    key, request = pending_request("g", 100.0, waited=100.5)
    young_key, young = pending_request("young", 101.9)
    pending = {key: request, young_key: young}
    assert [k for k, _ in watcher.unmet(pending, 102.0)] == [key]  # only the one over 1 s
    assert watcher._watch.asked == [("held_async", "allreduce 'g'")]
    assert watcher.crossed(pending, 103.0) == []  # no full exchange found it missing
    watcher.exchanged({key: [1]}, pending, 103.0)
    assert watcher.crossed(pending, 102.0) == []  # waited in synchronize() under 2 s
    assert [k for k, _ in watcher.crossed(pending, 103.0)] == [key]
    assert ("crossed", "allreduce 'g'", [1]) in watcher._watch.asked


def test_the_stop_message_says_why(monkeypatch):
    torn_down = []
    monkeypatch.setattr(stalls, "teardown_later", torn_down.append)
    watcher = inspector(stall_shutdown=2.0, timeout=9.0)
    watcher.missing = {(0, "late"): [2]}
    pending = dict([pending_request("late", 100.0)])
    assert "stalled for over 2 s" in watcher.stop_message(False, pending) and not torn_down
    message = watcher.stop_message(True, pending)
    assert "waited over 9 s" in message and "'late' is missing ranks [2]" in message
    assert torn_down == [message]


# -- join's bookkeeping ------------------------------------------------------------------------


def test_join_returns_the_rank_whose_join_was_agreed_last():
    ledger = JoinLedger(size=3)
    ledger.begin()
    assert ledger.joined and ledger.last is None
    assert ledger.agreed({0}) is None
    assert ledger.agreed({0, 2}) is None
    assert ledger.agreed({0, 1, 2}) == 1
    ledger.end(1)
    assert not ledger.joined and ledger.last == 1
    # Several join in the same last cycle: the highest of them; all at once: the highest.
    assert ledger.agreed({0}) is None and ledger.agreed({0, 1, 2}) == 2
    assert JoinLedger(size=2).agreed({0, 1}) == 1


def test_only_an_allreduce_runs_beside_joined_ranks():
    allreduce = {"collective": "allreduce", "name": "w"}
    broadcast = {"collective": "broadcast", "name": "b"}
    assert refused_beside(allreduce, (0, 1, 2), {1}) is None
    assert refused_beside(broadcast, (0, 2), {1}) is None  # the joined rank is not in the set
    error = refused_beside(broadcast, (0, 1, 2), {1})
    assert "broadcast 'b' cannot run while ranks [1] have joined" in str(error)


# -- fusion buckets ----------------------------------------------------------------------------


def fusable(name: str, nbytes: int, key="float32", process_set=0):
    fusion = types.SimpleNamespace(key=key, array=np.zeros(nbytes, dtype=np.uint8))
    return types.SimpleNamespace(key=(process_set, name), fusion=fusion)


def unfusable(name: str):
    return types.SimpleNamespace(key=(0, name), fusion=None)


def names(batches: list) -> list:
    return [[request.key[1] for request in batch] for batch in batches]


def test_buckets_fill_up_to_the_threshold_in_the_agreed_order():
    requests = [fusable("a", 40), fusable("b", 40), fusable("c", 40), fusable("d", 100)]
    assert names(into_batches(requests, 100)) == [["a", "b"], ["c"], ["d"]]
    assert names(into_batches(requests, 1000)) == [["a", "b", "c", "d"]]


def test_buckets_keep_apart_what_cannot_share_a_buffer():
    requests = [
        fusable("a", 8),
        fusable("h", 8, key="float16"),
        unfusable("g"),
        fusable("b", 8),
        fusable("s", 8, process_set=1),
    ]
    assert names(into_batches(requests, 1000)) == [["a", "b"], ["h"], ["g"], ["s"]]


@pytest.mark.parametrize("threshold", [0, -1])
def test_no_fusion_runs_each_request_alone(threshold):
    requests = [fusable("a", 8), fusable("b", 8)]
    assert names(into_batches(requests, threshold)) == [["a"], ["b"]]
