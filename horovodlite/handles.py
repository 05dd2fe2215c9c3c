"""What an asynchronous collective is while it runs: a Request on the engine's side, and the
handle the caller holds: the Request itself where it was submitted alone, else a Handle over
the requests submitted together (a grouped collective).

A handle's result is waited for with done() and wait() (poll() and synchronize()); asking for
it tells the engine that somebody waits, so it cycles without delay (wakeup.py). Threads wait
on one `Finished` per engine, notified once per batch of results: a threading.Event per request
cost more to create and set than the rest of a small request's bookkeeping, and a Handle object
per request about 0.2 µs more than handing out the Request (docs/engine.md).
"""

import threading
import time

from .agreement import FAILED, digest
from .fusion import zeros_entry
from .plan import Plan

__all__ = ["Finished", "Handle", "Request"]


class Request:
    """One submitted collective on this rank, until it finishes; the handle of one submitted
    alone."""

    __slots__ = ("plan", "fusion", "key", "_fingerprint", "submitted", "waited", "result",
                 "error", "finished", "_waits", "__weakref__")  # fmt: skip

    def __init__(self, plan: Plan, key: tuple, submitted: float, finished=None,
                 fingerprint: int = None, fusion=None):  # fmt: skip
        self.plan, self.key, self._fingerprint = plan, key, fingerprint
        # The all-reduce's FusionEntry, which the engine fuses: the plan's, or this call's own
        # beside a plan that repeated calls share (asynchronous.repeated_allreduce_plan).
        self.fusion = plan.fusion if fusion is None else fusion
        self.submitted = submitted  # time.monotonic() at submission
        self._waits = finished  # the engine's Finished, where its handle waits
        self.waited = None  # when a thread of this rank began to wait for it in synchronize()
        self.result = self.error = None
        self.finished = False

    @classmethod
    def zeros(cls, fields: dict, key: tuple, fingerprint: int) -> "Request":
        """Return the all-reduce a joined rank runs in place of one it never submitted."""
        plan = Plan(dict(fields), key[0], None, fusion=zeros_entry(fields))
        return cls(plan, key, time.monotonic(), None, fingerprint)

    @property
    def fingerprint(self) -> int:
        """The digest of the plan's fields (agreement.digest), or FAILED after an argument error."""
        if self._fingerprint is None:
            plan = self.plan
            self._fingerprint = FAILED if plan.error is not None else digest(plan.fields)
        return self._fingerprint

    def matches(self, fields: dict, fingerprint: int) -> bool:
        """Return whether this request has the digest `fingerprint` of agreed `fields`.

        Repeated calls share one fields object (plan.templates), and the engine keeps this
        rank's own in its cache: the very same object needs no hashing.
        """
        plan = self.plan
        if plan.fields is fields and plan.error is None:
            return True
        return self.fingerprint == fingerprint

    # -- as its own handle ------------------------------------------------------------------

    def done(self) -> bool:
        """Return whether the result is ready (wait() will not block)."""
        if self.finished:
            return True
        self._waits.wakeup.flush()  # somebody asks for the result: no need to wait for more
        return False

    def wait(self):
        """Block until done; return the result or raise the collective's error."""
        if not self.finished:
            self._waits.block((self,))
        if self.error is not None:
            raise self.error
        return self.result


class Finished:
    """Where threads wait for requests: the engine finishes a batch, then notifies once.
    `wakeup` is the engine's (wakeup.Wakeup): a waiting thread tells it."""

    def __init__(self, wakeup):
        self.wakeup = wakeup
        self._condition = threading.Condition()

    def finish(self, requests: list, results=None, error=None) -> None:
        """Give `requests` their `results` (in order) or `error`; wake the waiting threads."""
        if results is not None:
            for request, result in zip(requests, results):
                request.result = result
                request.finished = True
        else:  # (a Request starts with no result and no error)
            for request in requests:
                request.error = error
                request.finished = True
        with self._condition:  # a waiter tests `finished` under this lock: none misses it
            self._condition.notify_all()

    def block(self, requests) -> None:
        """Block until every one of `requests` has finished, telling the engine that somebody
        waits (it cycles at once)."""
        now = time.monotonic()
        for request in requests:
            request.waited = request.waited or now
        with self.wakeup.waiting(), self._condition:
            self._condition.wait_for(lambda: all(request.finished for request in requests))


class Handle:
    """The pending result of requests submitted together: done() and wait() it (poll() and
    synchronize()); a list of results where `grouped`."""

    def __init__(self, requests: list, grouped: bool, finished: Finished):
        self._requests, self._grouped, self._finished = requests, grouped, finished

    def done(self) -> bool:
        """Return whether the result is ready (wait() will not block)."""
        for request in self._requests:
            if not request.finished:
                self._finished.wakeup.flush()  # somebody asks: no need to wait for more
                return False
        return True

    def wait(self):
        """Block until done; return the result or raise the collective's error."""
        requests = self._requests
        for request in requests:
            if not request.finished:
                self._finished.block(requests)
                break
        for request in requests:
            if request.error is not None:
                raise request.error
        if self._grouped:
            return [request.result for request in requests]
        return requests[0].result
