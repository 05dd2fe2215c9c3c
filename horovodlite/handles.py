"""What an asynchronous collective is while it runs: a Request on the engine's side, and the
Handle the caller holds.

A Handle's result is waited for with poll() and synchronize(); asking for it tells the engine
that somebody waits, so it cycles without delay (wakeup.py). Threads wait on one `Finished`
per engine, notified once per batch of results: a threading.Event per request cost more to
create and set than the rest of a small request's bookkeeping (docs/engine.md).
"""

import threading
import time

from .agreement import FAILED, digest
from .fusion import zeros_entry
from .plan import Plan

__all__ = ["Finished", "Handle", "Request"]


class Request:
    """One submitted collective on this rank, until it finishes."""

    __slots__ = ("plan", "key", "_fingerprint", "submitted", "waited", "result", "error",
                 "finished", "__weakref__")  # fmt: skip

    def __init__(self, plan: Plan, key: tuple, submitted: float, fingerprint: int = None):
        self.plan, self.key, self._fingerprint = plan, key, fingerprint
        self.submitted = submitted  # time.monotonic() at submission
        self.waited = None  # when a thread of this rank began to wait for it in synchronize()
        self.result = self.error = None
        self.finished = False

    @classmethod
    def zeros(cls, fields: dict, key: tuple, fingerprint: int) -> "Request":
        """Return the all-reduce a joined rank runs in place of one it never submitted."""
        plan = Plan(dict(fields), key[0], None, fusion=zeros_entry(fields))
        return cls(plan, key, time.monotonic(), fingerprint)

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


class Finished:
    """Where threads wait for requests: the engine finishes a batch, then notifies once."""

    def __init__(self):
        self._condition = threading.Condition()

    def finish(self, requests: list, results=None, error=None) -> None:
        """Give `requests` their `results` (in order) or `error`; wake the waiting threads."""
        for i, request in enumerate(requests):
            request.result = None if results is None else results[i]
            request.error = error
            request.finished = True
        with self._condition:  # a waiter tests `finished` under this lock: none misses it
            self._condition.notify_all()

    def wait(self, requests: list) -> None:
        """Block until every one of `requests` has finished."""
        with self._condition:
            self._condition.wait_for(lambda: all(request.finished for request in requests))


class Handle:
    """The pending result of an asynchronous collective: poll() it, then synchronize() it."""

    def __init__(self, requests: list, grouped: bool, wakeup, finished: Finished):
        self._requests, self._grouped = requests, grouped
        self._wakeup, self._finished = wakeup, finished

    def done(self) -> bool:
        """Return whether the result is ready (synchronize() will not block)."""
        for request in self._requests:
            if not request.finished:
                self._wakeup.flush()  # somebody asks for the result: no need to wait for more
                return False
        return True

    def wait(self):
        """Block until done; return the result or raise the collective's error."""
        requests = self._requests
        for request in requests:  # (done(), without its call: a step waits on every gradient)
            if not request.finished:
                self._block()
                break
        for request in requests:
            if request.error is not None:
                raise request.error
        if self._grouped:
            return [request.result for request in requests]
        return requests[0].result

    def _block(self) -> None:
        """Wait until every request has finished, telling the engine that somebody waits."""
        if self.done():  # (which flushes otherwise)
            return
        now = time.monotonic()
        for request in self._requests:
            request.waited = request.waited or now
        with self._wakeup.waiting():
            self._finished.wait(self._requests)
