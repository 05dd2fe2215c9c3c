"""The engine's side of hvd.join(): who has joined, who joined last, and what runs beside them.

A rank that calls join() tells its engine (`JoinLedger.begin`); from the next cycle on it
reports itself joined in the negotiation (negotiation.py, `not_joined`), and each cycle's
MIN tells every rank the same set of joined ranks. The cycles thereby order the joins: the
last rank to join is the one whose join was first agreed in the cycle in which every rank had
joined (the highest of them if several), and join() returns it on every rank.

Beside joined ranks only all-reduces run: a joined rank contributes zeros to them
(handles.Request.zeros), and any other collective of a process set with a joined rank fails on
the ranks that submitted it (`refused_beside`). The synchronous side of join() is joining.py.

This module owns this rank's join state and that rule. User threads mark a join under the
engine's lock; the rest is read and changed by the engine thread alone.
"""

from typing import Optional

from .agreement import describe
from .exceptions import HorovodLiteError

__all__ = ["JoinLedger", "refused_beside"]


class JoinLedger:
    """This rank's join, and the ranks that the cycles agreed have joined, until all have."""

    __slots__ = ("size", "joined", "last", "_before")

    def __init__(self, size: int):
        self.size = size
        self.joined = False  # this rank is in join(): read as each cycle begins
        self.last = None  # the rank that joined last, once every rank has (join()'s result)
        self._before: set = set()  # the ranks agreed to have joined before this cycle

    def begin(self) -> None:
        """Join: from the next cycle on, this rank reports itself joined."""
        self.joined, self.last = True, None

    def agreed(self, joined_ranks: set) -> Optional[int]:
        """Note the ranks a cycle agreed have joined; return the last to join once all have."""
        if len(joined_ranks) < self.size:
            self._before = joined_ranks
            return None
        last = max(joined_ranks - self._before or joined_ranks)
        self._before = set()
        return last

    def end(self, last: int) -> None:
        """Leave join(), which returns `last` (as agreed() returned it)."""
        self.joined, self.last = False, last


def refused_beside(fields: dict, ranks: tuple, joined_ranks: set) -> Optional[HorovodLiteError]:
    """Return why an agreed collective with `fields` on `ranks` cannot run, or None if it can."""
    if fields["collective"] == "allreduce" or not joined_ranks.intersection(ranks):
        return None
    return HorovodLiteError(
        f"{describe(fields)} cannot run while ranks {sorted(joined_ranks)} have joined: only "
        "allreduce takes part in join()"
    )
