"""Single-process unit tests of the engine's bookkeeping: the cache of agreed requests, requests
and their results, and the wake-ups after a flush (issue #38)."""

import contextlib
import threading
import time

import numpy as np
from mpi4py import MPI

from horovodlite import wakeup as wakeup_module
from horovodlite.agreed_cache import AgreedCache
from horovodlite.agreement import FAILED, digest
from horovodlite.handles import Finished, Handle, Request
from horovodlite.plan import Plan, templates
from horovodlite.wakeup import Wakeup


def request(name: str, fields: dict = None, error: Exception = None) -> Request:
    fields = fields if fields is not None else {"collective": "allreduce", "name": name}
    return Request(Plan(fields, 0, None, error=error), (0, name), time.monotonic())


def test_a_request_digests_its_fields_when_asked():
    fields = {"collective": "allreduce", "name": "w", "shape": (3,)}
    assert request("w", fields).fingerprint == digest(fields)
    assert request("w", fields, ValueError("bad")).fingerprint == FAILED


def test_a_request_matches_its_own_fields_without_hashing_and_equal_ones_by_digest():
    fields = {"collective": "allreduce", "name": "w", "shape": (3,)}
    same = request("w", fields)
    assert same.matches(fields, 12345)  # the very same object: no digest is computed
    assert same._fingerprint is None
    equal = request("w", dict(fields))
    assert equal.matches(fields, digest(fields))
    assert not equal.matches(fields, digest(fields) + 1)
    # An argument error on this call fails it, whatever fields object it shares.
    assert not request("w", fields, ValueError("read-only")).matches(fields, digest(fields))


def test_the_cache_offers_one_byte_per_agreed_request():
    cache = AgreedCache(rank=1)
    a, b, c = ({"collective": "allreduce", "name": n} for n in "abc")
    cache.agreed((0, "a"), digest(a), a, (0, 1))
    cache.agreed((5, "b"), digest(b), b, (0, 2))  # a process set without rank 1
    cache.agreed((0, "c"), digest(c), c, (0, 1))
    assert len(cache) == 3
    # Holding a with its fields: 2; b is not rank 1's to send: 1; c not yet: 0.
    mine, all_cached = cache.offer({(0, "a"): request("a", a)}, joined=False)
    assert mine.tolist() == [2, 1, 0] and all_cached
    # c with other fields, or a request the cache does not know: a full exchange.
    changed = request("c", {**c, "shape": (2,)})
    mine, all_cached = cache.offer({(0, "c"): changed}, joined=False)
    assert mine.tolist() == [0, 1, 0] and not all_cached
    _, all_cached = cache.offer({(0, "d"): request("d")}, joined=False)
    assert not all_cached
    # A joined rank has nothing to send.
    mine, _ = cache.offer({}, joined=True)
    assert mine.tolist() == [1, 1, 1]
    # Ready: every rank has it (MIN > 0) and some rank sends it (MAX 2).
    lowest, highest = np.array([2, 1, 0], np.uint8), np.array([2, 1, 2], np.uint8)
    assert cache.ready(lowest, highest) == [(0, "a")]
    # Agreed again with new fields: the same position.
    cache.agreed((0, "c"), changed.fingerprint, changed.plan.fields, (0, 1))
    assert cache.entries[(0, "c")].index == 2 and cache.entries[(0, "c")].fields["shape"] == (2,)


def test_the_cache_is_cleared_past_its_limit(monkeypatch):
    monkeypatch.setattr(AgreedCache, "LIMIT", 2)
    cache = AgreedCache(rank=0)
    for name in "abc":
        cache.agreed((0, name), 1, {"name": name}, (0,))
    cache.clear_if_full()
    assert len(cache) == 0 and cache.offer({}, joined=False)[0].size == 0


def test_results_reach_the_threads_that_wait_for_them():
    wakeup = _Alarm()
    finished = Finished(wakeup)
    requests = [request(f"r{i}") for i in range(3)]
    handle = Handle(requests, True, finished)
    assert not handle.done() and wakeup.flushes == 1
    got = []
    waiter = threading.Thread(target=lambda: got.append(handle.wait()))
    waiter.start()
    finished.finish(requests[:2], ["x", "y"])
    time.sleep(0.05)
    assert not got  # one is still missing
    finished.finish(requests[2:], ["z"])
    waiter.join(timeout=10)
    assert got == [["x", "y", "z"]] and handle.done()
    failed = request("bad")
    finished.finish([failed], error=ValueError("no"))
    try:
        Handle([failed], False, finished).wait()
    except ValueError as exc:
        assert str(exc) == "no"
    else:
        raise AssertionError("the error was not raised")


def test_a_request_submitted_alone_is_its_own_handle():
    wakeup = _Alarm()
    finished = Finished(wakeup)
    alone = Request(Plan({"name": "w"}, 0, None), (0, "w"), time.monotonic(), finished)
    assert not alone.done() and wakeup.flushes == 1  # asking tells the engine
    got = []
    waiter = threading.Thread(target=lambda: got.append(alone.wait()))
    waiter.start()
    time.sleep(0.05)
    assert not got and alone.waited is not None  # it blocks, and marks when it began
    finished.finish([alone], ["result"])
    waiter.join(timeout=10)
    assert got == ["result"] and alone.done() and alone.wait() == "result"
    failed = Request(Plan({"name": "v"}, 0, None), (0, "v"), time.monotonic(), finished)
    finished.finish([failed], error=ValueError("no"))
    assert failed.done()
    try:
        failed.wait()
    except ValueError as exc:
        assert str(exc) == "no"
    else:
        raise AssertionError("the error was not raised")


class _Alarm:
    """A stand-in for the engine's Wakeup: counts flushes."""

    def __init__(self):
        self.flushes = 0

    def flush(self):
        self.flushes += 1

    def waiting(self):
        self.flush()
        return contextlib.nullcontext()


def test_a_flush_ends_the_pause_before_two_cycles():
    wakeup = Wakeup(MPI.COMM_SELF.Dup(), generation=0)
    try:
        start = time.monotonic()
        wakeup.flush()
        assert wakeup.pause(5.0) and wakeup.pause(5.0)
        assert time.monotonic() - start < 5.0  # ended by the flush, not by the 5 s pauses
        start = time.monotonic()
        assert not wakeup.pause(0.05)  # then the pauses are back
        assert time.monotonic() - start >= 0.04
        wakeup.flush()
        wakeup.clear()  # the engines agreed to sleep: the flush was served
        assert not wakeup.pause(0.0)
    finally:
        wakeup.close()


def test_a_sleeping_engine_tests_for_notes_often_only_after_a_note_woke_it():
    wakeup = Wakeup(MPI.COMM_SELF.Dup(), generation=0)
    polls, script = [], []  # the local event's timeouts; what each test finds (work, a note)

    class Work:  # the local event, answering from `script`
        def wait(self, timeout):
            polls.append(timeout)
            return script.pop(0)[0]

        def clear(self):
            pass

    wakeup._work = Work()
    wakeup._woken_by_another = lambda: script.pop(0)[1] if script else False
    try:
        assert not wakeup.noted  # the engines start asleep, with nothing known
        script[:] = [(True, None)]  # its own work wakes it
        wakeup.sleep()
        assert polls == [wakeup_module._MAX_POLL] and not wakeup.noted
        polls.clear()
        script[:] = [(False, None), (None, False), (False, None), (None, True)]  # then a note
        wakeup.sleep()
        assert polls == [wakeup_module._MAX_POLL] * 2 and wakeup.noted
        polls.clear()
        script[:] = [(False, None), (None, False), (True, None)]
        wakeup.sleep()  # after a note: the short back-off, until its own work wakes it
        assert polls == [wakeup_module._FIRST_POLL, 2 * wakeup_module._FIRST_POLL]
        assert not wakeup.noted
    finally:
        wakeup.close()


def test_templates_belong_to_one_settings_object():
    first, second = object(), object()
    memo = templates(first)
    memo["key"] = "template"
    assert templates(first) is memo
    assert templates(second) == {}
    assert "key" not in templates(first)  # new settings started afresh
