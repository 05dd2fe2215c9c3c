"""A parameter server's loop: answer pulls, apply pushes, notice workers that die.

The loop is plain MPI point-to-point on the job's own communicator (protocol.py), framework
free: what the server holds and how it updates it is a `store` that a binding provides:

- `dense()`: copies of the server's dense pieces, a list of arrays (sent while updates go on).
- `rows(index, rows)`: a copy of these global rows of embedding `index`.
- `sparse()`: `{index: a copy of the server's rows of embedding index}`.
- `apply(dense, sparse)`: one optimizer step with these gradients: `dense` a list of arrays in
  the order of `dense()`, `sparse` `{index: (global rows, values)}`.
- `state()`: bytes holding the pieces and the optimizer's state, for a checkpoint.

With `checkpoints` (checkpoint.py) the loop writes one every k updates and at its end; a loop
`resume`d from one starts at its version, with each worker's clock at its steps.
"""

import logging
import time

import numpy as np
from mpi4py import MPI

from horovodlite.exceptions import HorovodLiteError

from . import messages
from . import protocol as p
from .clocks import Clocks
from .stats import ServerStats
from .waits import wait_for

__all__ = ["ServerLoop"]

_log = logging.getLogger("horovodlite.ps")
_SENDER_DIED = object()  # what _receive returns for a message whose worker died sending it


class _SenderDied(Exception):
    pass


class ServerLoop:
    """Serve `workers` (ranks of `comm`) until each is done or dead.

    Args:
        comm: the job's own duplicate communicator.
        workers: the worker ranks.
        peers: rank -> waits.Peer, to tell whether a silent worker still lives.
        store: the server's parameters and optimizer (see the module docstring).
        staleness: None (asynchronous), or the most steps a worker may run ahead (0: synchronous).
        silence: seconds without a message after which a worker on another host counts as dead.
        checkpoints: a checkpoint.ServerCheckpoints, or None not to checkpoint.
        resume: (version, {worker: steps}) of the checkpoint the store was restored from.
    """

    def __init__(self, comm, workers, peers, store, staleness, silence: float,
                 checkpoints=None, resume=(0, {})):  # fmt: skip
        self.comm, self.peers, self.store, self.silence = comm, peers, store, silence
        self.checkpoints = checkpoints
        self.clocks = Clocks(workers, staleness)
        self.stats = ServerStats(comm.rank)
        self.version, steps = resume  # optimizer updates applied so far
        self.applied = {w: steps.get(w, 0) for w in workers}  # worker -> its steps applied
        self.clocks.resume(self.applied, self.version)
        self.pending: dict = {}  # worker -> True while its dense pull waits for the rule
        self.finished: set = set()  # workers that sent DONE
        self.step_pushes: dict = {}  # synchronous: worker -> its push of the open step
        self._sends: list = []  # (destination, messages.Outgoing), kept until complete
        self._byes: set = set()  # finished workers that have read their FINAL

    def serve(self) -> dict:
        """Run until every worker has finished or died; return this server's summary."""

        def next_message():
            # False ends the wait when the last live worker was found dead meanwhile.
            if not self.clocks.live:
                return False
            return messages.arrived(self.comm, MPI.ANY_SOURCE, MPI.ANY_TAG)

        while (message := wait_for(next_message, self._check_workers)) is not False:
            obj = self._receive(message)
            if obj is not _SENDER_DIED:
                self._handle(message.source, message.tag, obj)
            self._answer_pulls()
            self._prune_sends()
            if not self.clocks.live:
                break
        self.stats.stop = time.perf_counter()
        if self.checkpoints is not None:  # a job restarted after its end resumes at its end
            self.checkpoints.write(self.version, self.applied, self.store.state())
        summary = self.stats.summary()
        final = (self.version, self.store.dense(), self.store.sparse(), summary,
                 sorted(self.clocks.dead))  # fmt: skip
        for worker in sorted(self.finished):
            self._send(worker, p.FINAL, final)
        # Leave only once every finished worker has read its FINAL (or died): a worker still
        # reading another server's would otherwise take this server's exit for its death.
        wait_for(self._farewells, self._check_finished)
        if not self.clocks.dead:
            self.comm.Free()  # nothing in flight; after a death, sends to it never complete
        return summary

    # -- messages -----------------------------------------------------------------------------

    def _receive(self, message: messages.Incoming):
        """Return the object `message` brings, or _SENDER_DIED if its worker died sending it."""

        def check():
            self._check_workers()
            if message.source in self.clocks.dead:
                raise _SenderDied

        try:
            return message.receive(check)
        except _SenderDied:
            return _SENDER_DIED

    def _handle(self, worker: int, tag: int, obj) -> None:
        self.stats.heard()
        self.peers[worker].heard = time.monotonic()
        if worker in self.clocks.dead:
            return  # taken for dead (silent on another host too long): too late to count
        if tag == p.PULL:
            self.clocks.join(worker)
            self.pending[worker] = True
        elif tag == p.ROWS:
            self.stats.bytes_in += p.payload_bytes(obj)
            self._send(worker, p.ROW_VALUES, {i: self.store.rows(i, r) for i, r in obj.items()})
        elif tag == p.PUSH:
            self._push(worker, *obj)
        elif tag == p.DONE:
            self.finished.add(worker)
            self.clocks.finish(worker)
            self._apply_complete_step()
        else:
            raise ValueError(f"parameter server {self.comm.rank}: unknown message tag {tag}")

    def _push(self, worker: int, version: int, dense: list, sparse: dict) -> None:
        self.stats.pushed(worker)
        self.stats.bytes_in += p.payload_bytes((dense, sparse))
        self.stats.staleness.append(self.version - version)
        self.clocks.pushed(worker)
        if self.clocks.synchronous:
            self.step_pushes[worker] = (dense, sparse)
            self._apply_complete_step()
        else:
            self._apply(dense, sparse, [worker])

    def _apply_complete_step(self) -> None:
        """Synchronous: once every live worker pushed the open step, apply their mean."""
        if not self.clocks.synchronous or not self.step_pushes:
            return
        if not self.clocks.step_complete(self.version):
            return
        workers = sorted(self.step_pushes)
        pushes = [self.step_pushes[w] for w in workers]
        self.step_pushes = {}
        n = len(pushes)
        dense = [sum(grads[k] for grads, _ in pushes) / n for k in range(len(pushes[0][0]))]
        sparse: dict = {}
        for _, rows in pushes:
            for index, (r, v) in rows.items():
                sparse.setdefault(index, []).append((r, v))
        merged = {
            i: (np.concatenate([r for r, _ in parts]), np.concatenate([v for _, v in parts]) / n)
            for i, parts in sparse.items()
        }
        self._apply(dense, merged, workers)

    def _apply(self, dense: list, sparse: dict, workers: list) -> None:
        self.store.apply(dense, sparse)
        self.version += 1
        self.stats.updates += 1
        for worker in workers:
            self.applied[worker] += 1
        if self.checkpoints is not None and self.checkpoints.due(self.version):
            self.checkpoints.write(self.version, self.applied, self.store.state())

    def _answer_pulls(self) -> None:
        for worker in sorted(self.pending):
            if worker in self.clocks.live and self.clocks.may_answer(worker):
                del self.pending[worker]
                self._send(worker, p.PARAMS, (self.version, self.store.dense()))

    # -- sends and deaths ---------------------------------------------------------------------

    def _send(self, worker: int, tag: int, obj) -> None:
        self.stats.bytes_out += p.payload_bytes(obj)
        self._sends.append((worker, messages.post(self.comm, obj, worker, tag)))

    def _prune_sends(self) -> int:
        """Drop completed sends, and sends to dead workers (never completed); return the rest.

        A send to a worker that said BYE is dropped too if MPI fails it: the worker has left.
        """
        kept, failed = [], []
        for worker, request in self._sends:
            if worker in self.clocks.dead:
                continue
            try:
                if not request.test():
                    kept.append((worker, request))
            except MPI.Exception as e:
                if worker not in self._byes:
                    failed.append((worker, e))
        self._sends = kept
        if failed:
            self._check_workers()  # a worker that died while it received: one death more
        for worker, error in failed:
            if worker not in self.clocks.dead:
                raise HorovodLiteError(
                    f"parameter server rank {self.comm.rank}: a message to "
                    f"worker rank {worker} failed in MPI: {error}"
                ) from error
        return len(self._sends)

    def _check_workers(self) -> None:
        """Called during long waits: take workers whose process is gone for dead."""
        for worker in sorted(self.clocks.live):
            # A worker whose pull waits here is silent by this server's doing.
            if not self.peers[worker].alive(self.silence, expected=worker not in self.pending):
                # The clock of a worker that joined late starts at the others' clock, so its
                # own pushes, not its clock, say how many steps it took.
                self.stats.dead[worker] = self.stats.pushes_by.get(worker, 0)
                self.clocks.died(worker)
                self.step_pushes.pop(worker, None)
                _log.warning(
                    "parameter server rank %d: worker rank %d died after %d steps; "
                    "going on with workers %s",
                    self.comm.rank, worker, self.stats.dead[worker], sorted(self.clocks.live),
                )  # fmt: skip
        self._apply_complete_step()
        self._answer_pulls()

    def _farewells(self):
        """True once every send is complete and every finished worker that lives said BYE."""
        while (message := messages.arrived(self.comm, MPI.ANY_SOURCE, p.BYE)) is not None:
            if self._receive(message) is not _SENDER_DIED:
                self._byes.add(message.source)
        waiting = self.finished - self.clocks.dead - self._byes
        return True if self._prune_sends() == 0 and not waiting else None

    def _check_finished(self) -> None:
        """Called while the last answers go out: a finished worker that died will not take its."""
        for worker in sorted(self.finished - self.clocks.dead):
            if not self.peers[worker].alive(self.silence):
                self.clocks.died(worker)
                _log.warning("parameter server rank %d: worker rank %d died after it finished",
                             self.comm.rank, worker)  # fmt: skip
