"""The consistency rule of a server: when a worker's pull may be answered, and when to update.

Each worker's clock is the number of steps it has pushed. A worker about to compute step t
(clock t) may receive parameters once every other live worker's clock is at least t - s:

- `staleness=None`: fully asynchronous, a pull is answered at once.
- `staleness=s > 0`: stale-synchronous parallel, no worker runs more than s steps ahead of the
  slowest live one. Every push is applied as it arrives, as one optimizer step.
- `staleness=0`: synchronous. The server sums the pushes of step t from every live worker,
  divides by their number and takes one optimizer step, exactly as data-parallel training on
  the combined batch does; pulls of step t + 1 are answered after it.

A worker that has not pulled yet is not waited for (it "joins late") except when synchronous,
where every worker takes part from step 0. A joining worker's clock starts at the slowest live
worker's, so it neither holds the others back nor counts as far behind. A dead or finished
worker no longer counts.
"""

from typing import Optional

__all__ = ["Clocks"]


class Clocks:
    """The steps pushed by each worker of one server, and which workers still count."""

    def __init__(self, workers, staleness: Optional[int]):
        self.staleness = staleness
        self.clock = {w: 0 for w in workers}
        self.live = set(workers)  # not dead, not finished
        self.dead: set = set()
        self.joined = set(workers) if staleness == 0 else set()

    def resume(self, steps: dict, version: int) -> None:
        """Start from a checkpoint: each worker at its steps (synchronous: all at `version`)."""
        for worker in self.clock:
            self.clock[worker] = version if self.synchronous else steps.get(worker, 0)

    @property
    def synchronous(self) -> bool:
        return self.staleness == 0

    def join(self, worker: int) -> None:
        """Count `worker` from its first pull on, starting at the slowest joined worker's clock."""
        if worker not in self.joined:
            others = [self.clock[w] for w in self.joined & self.live]
            self.clock[worker] = min(others) if others else self.clock[worker]
            self.joined.add(worker)

    def slowest(self) -> Optional[int]:
        """Return the smallest clock among live joined workers (None when there are none)."""
        counted = [self.clock[w] for w in self.joined & self.live]
        return min(counted) if counted else None

    def may_answer(self, worker: int) -> bool:
        """Whether `worker`'s pending pull (for its current clock) may be answered now."""
        if self.staleness is None:
            return True
        slowest = self.slowest()
        return slowest is None or self.clock[worker] - slowest <= self.staleness

    def pushed(self, worker: int) -> int:
        """Record one push of `worker`; return the step it belonged to."""
        step = self.clock[worker]
        self.clock[worker] = step + 1
        return step

    def step_complete(self, step: int) -> bool:
        """Whether every live worker has pushed `step` (synchronous mode)."""
        return all(self.clock[w] > step for w in self.live)

    def finish(self, worker: int) -> None:
        self.live.discard(worker)

    def died(self, worker: int) -> None:
        self.live.discard(worker)
        self.dead.add(worker)
