"""Events of a step, for the step anatomies of stop*/ (step_marks.py, step_threads.py).

The scripts wrap some of the engine's methods (an experiment: the wrappers add a little) and
mark, from any thread, when each call begins and ends: (time.perf_counter(), what) pairs, in the
order taken (a list's append is atomic under the GIL).
"""

import time


class StepEvents:
    """The marks taken so far, as (time, what) pairs."""

    def __init__(self):
        self.events: list = []

    def mark(self, what: str) -> None:
        self.events.append((time.perf_counter(), what))

    def clear(self) -> None:
        self.events.clear()

    def wrap(self, owner, name: str, before: str, after: str) -> None:
        """Replace `owner`'s `name` by a wrapper that marks `before` and `after` each call."""
        function = getattr(owner, name)

        def wrapped(*args, **kwargs):
            self.mark(before)
            try:
                return function(*args, **kwargs)
            finally:
                self.mark(after)

        setattr(owner, name, wrapped)

    def first_after(self, start: float) -> dict:
        """Return {what: the time of its first mark after `start`}."""
        first: dict = {}
        for at, what in sorted(self.events):
            if at > start:
                first.setdefault(what, at)
        return first
