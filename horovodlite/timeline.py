"""A Chrome-trace timeline of the engine's work, written by rank 0.

Each tensor gets its own row (a trace "thread") with the phases it went through: NEGOTIATE
(submitted until every rank agreed), QUEUE (agreed until its collective started), the copies into
and out of the fusion buffer, and the collective itself. Load the file in Perfetto or
chrome://tracing.
"""

import json
import threading
import time
from contextlib import contextmanager

__all__ = ["Timeline"]


class Timeline:
    """Append trace events to a JSON array on disk; close() makes it valid JSON."""

    def __init__(self, path: str, mark_cycles: bool = False):
        self.path, self.mark_cycles = path, mark_cycles
        self._file = open(path, "w")
        self._file.write("[\n")
        self._first = True
        self._rows: dict = {}
        self._lock = threading.Lock()
        self._origin = time.monotonic()

    def _micros(self, t: float) -> float:
        return round((t - self._origin) * 1e6, 3)

    def _write(self, event: dict) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.write(("" if self._first else ",\n") + json.dumps(event))
            self._first = False

    def _row(self, name: str) -> int:
        row = self._rows.get(name)
        if row is None:
            row = self._rows[name] = len(self._rows) + 1
            self._write(
                {"name": "thread_name", "ph": "M", "pid": 0, "tid": row, "args": {"name": name}}
            )
        return row

    def span(self, name: str, phase: str, start: float, end: float, **args) -> None:
        """Record that tensor `name` spent [start, end] (time.monotonic()) in `phase`."""
        event = {
            "name": phase,
            "ph": "X",
            "pid": 0,
            "tid": self._row(name),
            "ts": self._micros(start),
            "dur": self._micros(end) - self._micros(start),
        }
        if args:
            event["args"] = args
        self._write(event)

    @contextmanager
    def phase(self, names: list, phase: str):
        """Record `phase` for every tensor in `names` around the body."""
        start = time.monotonic()
        yield
        end = time.monotonic()
        for name in names:
            self.span(name, phase, start, end)

    def cycle(self) -> None:
        """Mark the start of an engine cycle, if asked to."""
        if self.mark_cycles:
            self._write(
                {
                    "name": "CYCLE_START",
                    "ph": "i",
                    "s": "g",
                    "pid": 0,
                    "tid": 0,
                    "ts": self._micros(time.monotonic()),
                }
            )

    def close(self) -> None:
        """Finish the JSON array and close the file."""
        with self._lock:
            if not self._file.closed:
                self._file.write("\n]\n")
                self._file.close()
