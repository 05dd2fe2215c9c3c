"""What an asynchronous collective is while it runs: a Request on the engine's side, and the
Handle the caller holds.

A Handle's result is waited for with poll() and synchronize(); asking for it tells the engine
that somebody waits, so it cycles without delay (wakeup.py).
"""

import threading
import time

from .fusion import zeros_entry
from .plan import Plan

__all__ = ["Handle", "Request"]


class Request:
    """One submitted collective on this rank, until it finishes."""

    def __init__(self, plan: Plan, key: tuple, fingerprint: int):
        self.plan, self.key, self.fingerprint = plan, key, fingerprint
        self.submitted = time.monotonic()
        self.agreed = None
        self.waited = None  # when a thread of this rank began to wait for it in synchronize()
        self.result = self.error = None
        self.event = threading.Event()

    @classmethod
    def zeros(cls, fields: dict, key: tuple, fingerprint: int) -> "Request":
        """Return the all-reduce a joined rank runs in place of one it never submitted."""
        return cls(Plan(dict(fields), key[0], None, fusion=zeros_entry(fields)), key, fingerprint)

    def finish(self, result=None, error=None) -> None:
        self.result, self.error = result, error
        self.event.set()


class Handle:
    """The pending result of an asynchronous collective: poll() it, then synchronize() it."""

    def __init__(self, requests: list, grouped: bool, wakeup):
        self._requests, self._grouped, self._wakeup = requests, grouped, wakeup

    def done(self) -> bool:
        """Return whether the result is ready (synchronize() will not block)."""
        if all(request.event.is_set() for request in self._requests):
            return True
        self._wakeup.flush()  # somebody asks for the result: no need to wait for more work
        return False

    def wait(self):
        """Block until done; return the result or raise the collective's error."""
        if not self.done():
            now = time.monotonic()
            for request in self._requests:
                request.waited = request.waited or now
            with self._wakeup.waiting():
                for request in self._requests:
                    request.event.wait()
        for request in self._requests:
            if request.error is not None:
                raise request.error
        results = [request.result for request in self._requests]
        return results if self._grouped else results[0]
