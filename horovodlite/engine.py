"""The engine: asynchronous collectives, negotiated, fused and run by one background thread.

User threads submit Plans (collectives.py) in any order; the engine thread owns all of the
library's asynchronous MPI traffic. Each cycle the ranks agree which named requests every member
rank has submitted, in one order that is the same everywhere, then run them, packing compatible
all-reduces into one fusion buffer.

Negotiation costs one small MPI_Allreduce per cycle in steady state: of one Message
(negotiation.py), whose named fields confirm each request the ranks agreed on before (the cache,
agreed_cache.py) by one byte; only when some rank holds a request the cache does not know do the
ranks exchange full metadata (negotiation.full_exchange), which also finds mismatches and the
ranks each request misses. The engine decides and acts; what it asks lives by concern: the
StallInspector (stalls.py) watches the times, the JoinLedger (join_ledger.py) keeps join's
bookkeeping, and the agreed requests go into fusion buckets (buckets.py).

While no rank has asynchronous work the engines sleep, all of them, and no cycle runs
(wakeup.py). Waits on other ranks go through the state's Watch (waiting.py): no core is burnt,
and a request pending longer than the collective timeout fails on every rank and tears the job
down.
"""

import dataclasses
import logging
import threading
import time
from typing import Optional

import numpy as np
from mpi4py import MPI

from .agreed_cache import AgreedCache
from .agreement import describe
from .buckets import into_batches
from .exceptions import HorovodLiteError, MismatchError
from .fusion import fused_allreduce
from .handles import Finished, Handle, Request
from .join_ledger import JoinLedger, refused_beside
from .negotiation import Message, Status, full_exchange
from .stalls import StallInspector
from .timeline import Timeline
from .wakeup import Wakeup, gathering_left, gathering_times, overlap_pays

__all__ = ["Engine", "Handle"]

_log = logging.getLogger("horovodlite")

_NEGOTIATION = -1  # the negotiation's identity for the Watch; digests are never negative


class Engine:
    """The background thread that negotiates and runs asynchronous collectives."""

    def __init__(self, state):
        self.state = state
        self.comm = state.process_sets.lookup(0).engine_comm
        self._world = range(self.comm.size)
        settings = state.settings
        # Copied from the settings as tunables that tests and benchmarks may change at run time.
        self.cycle_time = settings.cycle_time
        self.fusion_threshold = settings.fusion_threshold
        overlap = settings.overlap
        self.overlap = overlap_pays(state.cores_per_rank) if overlap is None else overlap
        self._gather = gathering_times(one_host=state.local_comm.size == state.comm.size)
        self.timeline = None
        self._lock = threading.Lock()
        self._cycled = threading.Condition(self._lock)  # notified as a cycle ends, or at a stop
        self._wakeup = Wakeup(self.comm, state.generation)
        self._finished = Finished(self._wakeup)  # where threads wait for results
        self._incoming: list = []
        self._in_flight: set = set()
        self._pending: dict = {}  # key -> Request waiting for agreement
        self._cache = AgreedCache(self.comm.rank)  # the same on every rank
        self.stalls = StallInspector(settings, state.watch, self.comm.rank)
        self._join = JoinLedger(self.comm.size)  # user threads mark joins under the lock
        # (process set id, kind) -> unnamed requests so far: counted per process set, as only
        # its members submit them, so that a set's requests leave the others' names in step.
        self._auto_names: dict = {}
        self._stop_requested = False
        self._stopped = None  # the error that stopped the engine
        self.cycles = self._cycles_ended = 0  # cycles begun; cycles ended
        if settings.timeline and self.comm.rank == 0:
            self.timeline = Timeline(settings.timeline, settings.timeline_mark_cycles)
        self._thread = threading.Thread(target=self._run, name="horovodlite-engine", daemon=True)
        self._thread.start()

    # The stall settings live with the inspector, the one that reads them.
    @property
    def stall_check(self) -> float:
        return self.stalls.stall_check

    @property
    def stall_shutdown(self) -> float:
        return self.stalls.stall_shutdown

    # -- user side ------------------------------------------------------------------------------

    def submit(self, plans: list, grouped: bool = False):
        """Queue `plans` for the engine thread; return their Handle, or the Request itself of
        one plan alone and not `grouped`.

        Raises:
            ValueError: a request of the same name is already in flight on this rank.
            HorovodLiteError: the engine has stopped.
        """
        requests = []
        with self._lock:  # (taking the time here keeps the requests in submission order)
            submitted = time.monotonic()
            if self._stopped is not None:  # name the collective, as pending ones do
                raise type(self._stopped)(f"{describe(plans[0].fields)}: {self._stopped}")
            try:
                for plan in plans:
                    requests.append(self._request(plan, submitted))
            except ValueError:
                self._in_flight.difference_update(request.key for request in requests)
                raise
            self._incoming += requests
        self._wakeup.set()
        if len(requests) == 1 and not grouped:
            return requests[0]  # its own handle, as submit_one's
        return Handle(requests, grouped, self._finished)

    def submit_one(self, plan, fusion=None) -> Request:
        """submit([plan]) with less Python: a backward pass submits each gradient alone. The
        Request is its own handle. `fusion`: this call's FusionEntry, where `plan` is one that
        repeated calls share (asynchronous.repeated_allreduce_plan)."""
        with self._lock:
            if self._stopped is not None:
                raise type(self._stopped)(f"{describe(plan.fields)}: {self._stopped}")
            request = self._request(plan, time.monotonic(), fusion)
            self._incoming.append(request)
        self._wakeup.set()
        return request

    def _request(self, plan, submitted: float, fusion=None) -> Request:
        """Name `plan` if unnamed and take its name on this rank; return its Request."""
        name = plan.fields.get("name")  # (plan.name, without the property's call)
        if name is None:
            counter = (plan.process_set_id, plan.kind)
            count = self._auto_names.get(counter, 0)
            self._auto_names[counter] = count + 1
            name = _auto_name(plan.kind, count)
            # Copies: the plan, or its fields, may be a template's that other calls share.
            plan = dataclasses.replace(plan, fields={**plan.fields, "name": name})
        key = (plan.process_set_id, name)
        if key in self._in_flight:  # (also a name given twice in one group)
            raise ValueError(
                f"{describe(plan.fields)} is already in flight on this rank: its name is free "
                "again once it has finished here (synchronize() it, or call barrier() once every "
                "rank has submitted it), or give each its own name"
            )
        self._in_flight.add(key)
        return Request(plan, key, submitted, self._finished, None, fusion)

    def begin_join(self) -> None:
        """Join, contributing zeros to all-reduces; return once every engine agreed on it.

        join() answers the others' collectives only after this, so a rank that learns of this
        join from one joins in a later cycle: the cycles order the joins (_update_join).
        """
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            self._join.begin()
            agreed = self.cycles + 1  # the next cycle to begin reads the join under this lock
        self._wakeup.flush()
        self._wait_for(lambda: self._cycles_ended >= agreed)
        if self._stopped is not None:
            raise self._stopped

    def end_join(self) -> int:
        """Wait until every rank's engine has joined; return the last rank to join."""
        self._wait_for(lambda: self._join.last is not None)
        if self._join.last is None:
            raise self._stopped
        return self._join.last

    def drain(self) -> None:
        """Wait until this rank's requests that every rank submitted before now have finished.

        Two cycles that begin after now suffice: another rank's engine may have begun the first
        before that rank submitted (before it reached hvd.barrier(), say), but it begins the
        second only after this rank's engine took part in the first.
        """
        with self._lock:
            if not self._in_flight:
                return  # the common case: nothing to wait for, and no engine to wake
            enough = self.cycles + 2
        with self._wakeup.waiting():  # somebody waits: cycle at once, no gathering
            self._wait_for(lambda: not self._in_flight or self._cycles_ended >= enough)

    def _wait_for(self, done) -> None:
        """Block until `done()` holds as a cycle ends, or the engine has stopped."""
        with self._cycled:
            self._cycled.wait_for(lambda: done() or self._stopped is not None)

    def start_timeline(self, path: str, mark_cycles: bool = False) -> None:
        """Write a Chrome-trace timeline to `path` (rank 0 only)."""
        if self.comm.rank == 0:
            self.stop_timeline()
            self.timeline = Timeline(path, mark_cycles)

    def stop_timeline(self) -> None:
        """Finish and close the timeline file, if any."""
        timeline, self.timeline = self.timeline, None
        if timeline is not None:
            timeline.close()

    def stop(self) -> None:
        """Stop the engine on every rank; pending requests fail. Safe to call twice."""
        with self._lock:
            self._stop_requested = True
        self._wakeup.flush()
        self._thread.join(timeout=30)
        self.stop_timeline()

    # -- engine thread --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._wakeup.sleep()  # the engines start asleep, together
            last_cycle, hold = time.monotonic(), 0.0
            while self._stopped is None:
                # Gather what this rank submits within one cycle time, unless waited for.
                pause = max(hold, self.cycle_time - (time.monotonic() - last_cycle))
                hold = self._gathering(self._wakeup.pause(pause))
                if hold > 0:
                    # No spare core to overlap with: one wake-up when the gathering ends, not
                    # one a cycle time, each of which takes the GIL from the submitting thread.
                    continue
                last_cycle = time.monotonic()
                busy = self._cycle()
                with self._cycled:
                    self._cycles_ended = self.cycles
                    self._cycled.notify_all()
                if not busy and self._stopped is None:
                    self._wakeup.agreed_to_sleep()  # no rank had work: all sleep till one has
                    with self._lock:  # a submission or flush already served wakes nobody
                        if not (self._incoming or self._join.joined or self._stop_requested):
                            self._wakeup.clear()
                    self._wakeup.sleep()
        except Exception as exc:  # a bug or an MPI failure: fail loudly, never hang users
            _log.exception("horovodlite engine failed")
            self._stop_all(HorovodLiteError(f"the horovodlite engine failed: {exc}"))
        finally:
            self._wakeup.close()

    def _gathering(self, flushed: bool) -> float:
        """Return 0 to cycle now, else for how many more seconds to gather this rank's requests.

        Cycle with a spare core (`overlap`), once somebody waits for a result, with no requests
        of one's own (others may wait), joined or stopping; else gather (wakeup.py).
        """
        if flushed or self.overlap:
            return 0.0
        with self._lock:
            if self._join.joined or self._stop_requested:
                return 0.0
            mine = self._incoming + list(self._pending.values())
        return gathering_left([request.submitted for request in mine], *self._gather)

    def _negotiate(self, message: Message) -> Message:
        """MIN-all-reduce `message` with every rank's engine; return the result, by field."""
        out = np.empty_like(message.vector)
        about = lambda: ("the engines' negotiation", _NEGOTIATION)  # noqa: E731
        request = self.comm.Iallreduce(message.vector, out, op=MPI.MIN)
        self.state.watch.wait(request, about, self._world)
        return message.decode(out)

    def _cycle(self) -> bool:
        """Run one negotiation cycle; return whether any rank had work."""
        with self._lock:
            incoming, self._incoming = self._incoming, []
            stopping, joined = self._stop_requested, self._join.joined
            self.cycles += 1
        pending, stalls, now = self._pending, self.stalls, time.monotonic()
        for request in incoming:
            pending[request.key] = request
        self._fail(stalls.unmet(pending, now))
        full, stalled, timed_out = stalls.inspect(pending, now)
        held, all_cached = self._cache.offer(pending, joined)
        sent = Message.encode(
            held, self.comm.rank, self.comm.size, joined=joined, stopping=stopping,
            all_cached=all_cached and not full, not_stalled=not stalled,
            not_timed_out=not timed_out, idle=not (pending or joined),
        )  # fmt: skip
        agreed = self._negotiate(sent)
        if self.timeline is not None and not agreed.holds(Status.IDLE):
            self.timeline.cycle()

        if not (agreed.holds(Status.NOT_STALLED) and agreed.holds(Status.NOT_TIMED_OUT)):
            timed_out = not agreed.holds(Status.NOT_TIMED_OUT)  # the same on every rank
            self._stop_all(HorovodLiteError(stalls.stop_message(timed_out, pending)))
            return False
        stopping_ranks = agreed.stopping_ranks()
        if stopping_ranks:
            who = ", ".join(map(str, stopping_ranks))
            self._stop_all(
                HorovodLiteError(
                    f"horovodlite was shut down on rank{'s' if len(stopping_ranks) > 1 else ''} "
                    f"{who} (hvd.shutdown(), or the end of its program) while this request was "
                    "pending: every rank must submit the same collectives before it stops"
                )
            )
            return False
        joined_ranks = agreed.joined_ranks()
        if agreed.holds(Status.ALL_CACHED):
            ready, errors = self._cache.ready(agreed.held, agreed.highest()), {}
        else:
            ready, errors, missing = full_exchange(
                self.comm, pending, self._cache, self._ranks_of, joined_ranks
            )
            stalls.exchanged(missing, pending, now)
            self._fail(stalls.crossed(pending, now))
        self._run_ready(ready, errors, joined_ranks)
        self._update_join(joined_ranks)
        return not agreed.holds(Status.IDLE)

    def _fail(self, failed: list) -> None:
        """Fail the pending requests of `failed`, (key, error) pairs, one by one."""
        for key, error in failed:
            self._finish([self._pending.pop(key)], error=error)

    def _ranks_of(self, process_set_id: int):
        entry = self.state.process_sets.lookup(process_set_id)
        return None if entry is None else entry.ranks

    def _run_ready(self, ready: list, errors: dict, joined_ranks: set) -> None:
        """Fail the requests of `errors`, then run the `ready` ones in order, in fusion buckets."""
        for key, message in errors.items():
            request = self._pending.pop(key, None)
            if request is not None:
                self._finish([request], error=request.plan.error or MismatchError(message))
        self.stalls.ran(ready)
        agreed, pending, entries, runs = time.monotonic(), self._pending, self._cache.entries, []
        for key in ready:
            request = pending.pop(key, None)  # (pending here: this rank is a member)
            if joined_ranks or request is None:  # beside joined ranks (join_ledger.py)
                entry = entries[key]
                if not entry.member:
                    continue
                refusal = refused_beside(entry.fields, entry.ranks, joined_ranks)
                if refusal is not None:
                    if request is not None:
                        self._finish([request], error=refusal)
                    continue
                if request is None:  # this rank has joined: it contributes zeros
                    request = Request.zeros(entry.fields, key, entry.fingerprint)
                    self._count_answered(key, entry.fields["collective"])
            runs.append(request)
        for batch in into_batches(runs, self.fusion_threshold):
            self._run_batch(batch, agreed)

    def _count_answered(self, key: tuple, kind: str) -> None:
        """Count an unnamed request that this joined rank answered with zeros as its own, so
        that once the join ends its next unnamed request takes the others' next name."""
        number = _auto_number(kind, key[1])
        if number is not None:
            counter = (key[0], kind)
            with self._lock:
                self._auto_names[counter] = max(self._auto_names.get(counter, 0), number + 1)

    def _run_batch(self, batch: list, agreed: float) -> None:
        """Run one batch (buckets.py) on its process set's communicator; hand out the results."""
        comm = self.state.process_sets.lookup(batch[0].key[0]).engine_comm
        timeline = self.timeline
        if timeline is not None:
            names = [str(request.key[1]) for request in batch]
            start = time.monotonic()
            for name, request in zip(names, batch):
                timeline.span(name, "NEGOTIATE", request.submitted, agreed)
                timeline.span(name, "QUEUE", agreed, start)
        try:
            plan = batch[0].plan
            if batch[0].fusion is not None:
                phase = None if timeline is None else (lambda p: timeline.phase(names, p))
                entries = [r.fusion for r in batch]
                results = fused_allreduce(comm, entries, phase)
            else:
                payloads = None
                if plan.payload is not None:
                    payloads = comm.allgather(plan.payload)
                if timeline is None:
                    results = [plan.execute(comm, payloads)]
                else:
                    with timeline.phase(names, plan.kind.upper()):
                        results = [plan.execute(comm, payloads)]
        except Exception as exc:
            error = HorovodLiteError(f"{describe(batch[0].plan.fields)} failed: {exc!r}")
            self._finish(batch, error=error)
            return
        self._finish(batch, results)

    def _finish(self, requests: list, results=None, error=None) -> None:
        """Free the names of `requests`, then hand them their results (or `error`)."""
        with self._lock:
            self._in_flight.difference_update([request.key for request in requests])
        self._finished.finish(requests, results, error)

    def _update_join(self, joined_ranks: set) -> None:
        last = self._join.agreed(joined_ranks)
        if last is not None:  # every rank has joined: join() returns
            with self._lock:
                self._join.end(last)

    def _stop_all(self, error: Exception) -> None:
        with self._cycled:  # and no waiter waits for a cycle any more
            self._stopped = error
            requests = list(self._pending.values()) + self._incoming
            self._pending, self._incoming = {}, []
            self._cycled.notify_all()
        for request in requests:  # each error names its own collective
            self._finish([request], error=type(error)(f"{describe(request.plan.fields)}: {error}"))


def _auto_name(kind: str, number: int) -> str:
    """Return the name of this rank's `number`th unnamed request of `kind` (in its process set)."""
    return f"{kind}.noname.{number}"


def _auto_number(kind: str, name) -> Optional[int]:
    """Return N where `name` is _auto_name(kind, N), else None."""
    prefix = _auto_name(kind, "")
    if isinstance(name, str) and name.startswith(prefix) and name[len(prefix) :].isdigit():
        return int(name[len(prefix) :])
    return None
