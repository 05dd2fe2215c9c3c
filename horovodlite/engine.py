"""The engine: asynchronous collectives, negotiated, fused and run by one background thread.

User threads submit Plans (collectives.py) in any order; the engine thread owns all of the
library's asynchronous MPI traffic. Each cycle the ranks agree which named requests every member
rank has submitted, in one order that is the same everywhere, then run them, packing compatible
all-reduces into one fusion buffer.

Negotiation costs one small MPI_Allreduce per cycle in steady state. Requests whose name and
metadata were agreed before (the cache, agreement.AgreedCache) are confirmed by one byte each in
that all-reduce; only when some rank holds a request the cache does not know do the ranks
exchange full metadata (an allgather of every pending request), which also detects mismatches
and stalls.

While no rank has asynchronous work the engines sleep, all of them, and no cycle runs
(wakeup.py). Waits on other ranks go through the state's Watch (waiting.py): no core is burnt,
and a request pending longer than the collective timeout fails on every rank and tears the job
down.
"""

import logging
import threading
import time

import numpy as np
from mpi4py import MPI

from .agreement import FAILED, AgreedCache, describe, error_text, mismatch_message
from .exceptions import HorovodLiteError, MismatchError
from .fusion import fused_allreduce
from .handles import Finished, Handle, Request
from .stalls import stall_shutdown_message, timeout_message, warn_of_stalls
from .timeline import Timeline
from .wakeup import Wakeup, gathering_left, gathering_times, overlap_pays

__all__ = ["Engine", "Handle"]

_log = logging.getLogger("horovodlite")

_MEETING_CHECK = 1.0  # seconds pending before a request is checked against synchronous waiters
_RECHECK = 0.25  # seconds between full exchanges that tell who a waited-for request misses
# Seconds in synchronize() before a request is checked against ranks blocked in a synchronous
# collective: another thread of theirs might still submit it, late on a loaded machine.
_CROSSED_CHECK = 2.0
_NEGOTIATION = -1  # the negotiation's identity for the Watch; digests are never negative

# Positions of the flags that follow the per-request bytes and the per-rank bytes.
_ALL_CACHED, _NOT_STALLED, _NOT_TIMED_OUT, _IDLE = range(4)


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
        self.stall_check = settings.stall_check
        self.stall_shutdown = settings.stall_shutdown
        self.timeout = settings.collective_timeout
        overlap = settings.overlap
        self.overlap = overlap_pays(state.local_comm.size) if overlap is None else overlap
        self._gather = gathering_times(one_host=state.local_comm.size == state.comm.size)
        self.timeline = None
        self._lock = threading.Lock()
        self._cycled = threading.Condition(self._lock)  # notified as a cycle ends, or at a stop
        self._finished = Finished()  # where threads wait for results
        self._wakeup = Wakeup(self.comm, state.generation)
        self._incoming: list = []
        self._in_flight: set = set()
        self._pending: dict = {}  # key -> Request waiting for agreement
        self._cache = AgreedCache(self.comm.rank)  # the same on every rank
        # (process set id, kind) -> unnamed requests so far: counted per process set, as only
        # its members submit them, so that a set's requests leave the others' names in step.
        self._auto_names: dict = {}
        self._stop_requested = self._joined = False
        self._stopped = None  # the error that stopped the engine
        self._join_result = None
        self._joined_before: set = set()
        self._last_stall_report = self._last_recheck = 0.0
        self._first_seen: dict = {}  # key -> when a full exchange first showed it incomplete
        self._missing: dict = {}  # key -> ranks the last full exchange found missing
        self.cycles = self._cycles_ended = 0  # cycles begun; cycles ended
        if settings.timeline and self.comm.rank == 0:
            self.timeline = Timeline(settings.timeline, settings.timeline_mark_cycles)
        self._thread = threading.Thread(target=self._run, name="horovodlite-engine", daemon=True)
        self._thread.start()

    # -- user side ------------------------------------------------------------------------------

    def submit(self, plans: list, grouped: bool = False) -> Handle:
        """Queue `plans` for the engine thread; return their Handle.

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
        return Handle(requests, grouped, self._wakeup, self._finished)

    def _request(self, plan, submitted: float) -> Request:
        """Name `plan` if unnamed and take its name on this rank; return its Request."""
        name = plan.name
        if name is None:
            counter = (plan.process_set_id, plan.kind)
            count = self._auto_names.get(counter, 0)
            self._auto_names[counter] = count + 1
            name = f"{plan.kind}.noname.{count}"
            # A copy: the plan's fields may be a template that other plans share.
            plan.fields = {**plan.fields, "name": name}
        key = (plan.process_set_id, name)
        if key in self._in_flight:  # (also a name given twice in one group)
            raise ValueError(
                f"{describe(plan.fields)} is already in flight on this rank: its name is free "
                "again once it has finished here (synchronize() it, or call barrier() once every "
                "rank has submitted it), or give each its own name"
            )
        self._in_flight.add(key)
        return Request(plan, key, submitted)

    def begin_join(self) -> None:
        """Join, contributing zeros to all-reduces; return once every engine agreed on it.

        join() answers the others' collectives only after this, so a rank that learns of this
        join from one joins in a later cycle: the cycles order the joins (_update_join).
        """
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            self._joined, self._join_result = True, None
            agreed = self.cycles + 1  # the next cycle to begin reads _joined under this lock
        self._wakeup.flush()
        self._wait_for(lambda: self._cycles_ended >= agreed)
        if self._stopped is not None:
            raise self._stopped

    def end_join(self) -> int:
        """Wait until every rank's engine has joined; return the last rank to join."""
        self._wait_for(lambda: self._join_result is not None)
        if self._join_result is None:
            raise self._stopped
        return self._join_result

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
                        if not (self._incoming or self._joined or self._stop_requested):
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
            if self._joined or self._stop_requested:
                return 0.0
            mine = self._incoming + list(self._pending.values())
        return gathering_left([request.submitted for request in mine], *self._gather)

    def _negotiate(self, vector: np.ndarray) -> np.ndarray:
        """MIN-all-reduce `vector` with every rank's engine."""
        out = np.empty_like(vector)
        about = lambda: ("the engines' negotiation", _NEGOTIATION)  # noqa: E731
        self.state.watch.wait(self.comm.Iallreduce(vector, out, op=MPI.MIN), about, self._world)
        return out

    def _cycle(self) -> bool:
        """Run one negotiation cycle; return whether any rank had work."""
        with self._lock:
            incoming, self._incoming = self._incoming, []
            stopping, joined = self._stop_requested, self._joined
            self.cycles += 1
        for request in incoming:
            self._pending[request.key] = request
        size, me, now = self.comm.size, self.comm.rank, time.monotonic()
        recheck = False
        if now - self._oldest(now) > _MEETING_CHECK:  # (every request is younger, most cycles)
            self._fail_sync_meetings(now)
            waited = min((r.waited for r in self._pending.values() if r.waited), default=now)
            if now - waited > _MEETING_CHECK and now - self._last_recheck > _RECHECK:
                recheck, self._last_recheck = True, now  # who misses it? (_fail_crossed_waits)
        oldest = self._oldest(now)

        count = len(self._cache)
        mine, all_cached = self._cache.offer(self._pending, joined)
        check_after = min(self.stall_check, self.timeout / 2)
        if now - oldest > check_after and now - self._last_stall_report > check_after:
            all_cached = False  # a full exchange tells who is missing
        all_cached = all_cached and not recheck
        timed_out = now - oldest > self.timeout
        stalled = self.stall_shutdown > 0 and now - oldest > self.stall_shutdown
        # Per rank: 0 where it has joined, 2 where it is shutting down, else 1.
        per_rank = np.full(size, 1, dtype=np.uint8)
        per_rank[me] = 0 if joined else 1
        idle = not (self._pending or joined)
        flags = np.array([all_cached, not stalled, not timed_out, idle], dtype=np.uint8)
        vector = np.concatenate([mine, 2 - mine, per_rank, 2 - per_rank, flags])
        if stopping:
            vector[2 * count + size + me] = 0  # 2 - 2
        agreed = self._negotiate(vector)
        lowest, highest = agreed[:count], 2 - agreed[count : 2 * count]
        joined_ranks = {r for r in range(size) if agreed[2 * count + r] == 0}
        stopping_ranks = [r for r in range(size) if agreed[2 * count + size + r] == 0]
        flags = agreed[2 * count + 2 * size :]
        if self.timeline is not None and not flags[_IDLE]:
            self.timeline.cycle()

        if not (flags[_NOT_STALLED] and flags[_NOT_TIMED_OUT]):  # the same on every rank
            names = sorted(str(key[1]) for key in self._pending)
            if flags[_NOT_TIMED_OUT]:
                message = stall_shutdown_message(self.stall_shutdown, names)
            else:
                message = timeout_message(self.timeout, list(self._missing.items()), names)
            self._stop_all(HorovodLiteError(message))
            return False
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
        if flags[_ALL_CACHED]:
            ready = self._cache.ready(lowest, highest)
            errors = {}
        else:
            ready, errors = self._exchange(joined_ranks, now)
            self._fail_crossed_waits(now)
        self._run_ready(ready, errors, joined_ranks)
        self._update_join(joined_ranks)
        return not flags[_IDLE]

    def _oldest(self, now: float) -> float:
        """Return when the oldest pending request was submitted (`now` if none)."""
        for request in self._pending.values():  # in submission order (submit)
            return request.submitted
        return now

    def _fail_sync_meetings(self, now: float) -> None:
        """Fail requests that other ranks wait for in a synchronous call: they never meet."""
        for key, request in list(self._pending.items()):
            if now - request.submitted > _MEETING_CHECK and request.fingerprint != FAILED:
                what = describe(request.plan.fields)
                error = self.state.watch.held_async(request.fingerprint, what)
                if error is not None:
                    del self._pending[key]
                    self._finish([request], error=error)

    def _fail_crossed_waits(self, now: float) -> None:
        """Fail a request waited for here that ranks blocked in a synchronous collective miss."""
        for key, request in list(self._pending.items()):
            missing = self._missing.get(key)
            if missing and request.waited is not None and now - request.waited > _CROSSED_CHECK:
                error = self.state.watch.crossed(describe(request.plan.fields), missing)
                if error is not None:
                    del self._pending[key]
                    self._finish([request], error=error)

    def _ranks_of(self, process_set_id: int):
        entry = self.state.process_sets.lookup(process_set_id)
        return None if entry is None else entry.ranks

    def _exchange(self, joined_ranks: set, now: float):
        """Exchange every pending request's metadata; return (ready keys, errors by key)."""
        mine = [
            (key, r.fingerprint, r.plan.fields, error_text(r.plan.error))
            for key, r in self._pending.items()
        ]
        submitted: dict = {}
        for rank, items in enumerate(self.comm.allgather(mine)):
            for key, fingerprint, fields, error in items:
                submitted.setdefault(key, {})[rank] = (fingerprint, fields, error)
        self._cache.clear_if_full()
        ready, errors, stalled = [], {}, []
        for key in submitted:  # in submission order, rank 0's first: see fusion.adjacent_span
            by_rank = submitted[key]
            ranks = self._ranks_of(key[0])
            if ranks is None:
                errors[key] = f"process set {key[0]} is not registered on every rank"
                continue
            missing = [r for r in ranks if r not in by_rank and r not in joined_ranks]
            if not missing:
                self._missing.pop(key, None)
            else:
                self._missing[key] = missing
                stalled.append((key, missing, self._first_seen.setdefault(key, now)))
                continue
            self._first_seen.pop(key, None)
            fingerprints = {fingerprint for fingerprint, _, _ in by_rank.values()}
            if len(fingerprints) > 1 or FAILED in fingerprints:
                errors[key] = mismatch_message(
                    [(r, fields, error) for r, (_, fields, error) in sorted(by_rank.items())]
                )
                continue
            fingerprint, fields, _ = next(iter(by_rank.values()))
            own = self._pending.get(key)  # its fields object: see Request.matches
            self._cache.agreed(key, fingerprint, fields if own is None else own.plan.fields, ranks)
            ready.append(key)
        self._report_stalls(stalled, now)
        ready.sort(key=lambda k: self._cache.entries[k].index)
        return ready, errors

    def _report_stalls(self, stalled: list, now: float) -> None:
        late = [(key, missing) for key, missing, since in stalled if now - since > self.stall_check]
        if not late or now - self._last_stall_report < self.stall_check:
            return  # once per stall check period, not once per cycle
        self._last_stall_report = now
        if self.comm.rank == 0 or any(key in self._pending for key, _ in late):
            warn_of_stalls(late, self.stall_check)

    def _run_ready(self, ready: list, errors: dict, joined_ranks: set) -> None:
        """Run the agreed requests in order, fusing compatible all-reduces."""
        for key, message in errors.items():
            request = self._pending.pop(key, None)
            if request is not None:
                self._finish([request], error=request.plan.error or MismatchError(message))
        now, threshold, entries = time.monotonic(), self.fusion_threshold, self._cache.entries
        batches, open_buckets = [], {}
        for key in ready:
            self._missing.pop(key, None)
            entry = entries[key]
            if not entry.member:
                continue
            request = self._pending.pop(key, None)
            fields = entry.fields
            if fields["collective"] != "allreduce" and joined_ranks & set(entry.ranks):
                if request is not None:
                    error = HorovodLiteError(
                        f"{describe(fields)} cannot run while ranks {sorted(joined_ranks)} have "
                        "joined: only allreduce takes part in join()"
                    )
                    self._finish([request], error=error)
                continue
            if request is None:  # this rank has joined: it contributes zeros
                request = Request.zeros(fields, key, entry.fingerprint)
            request.agreed = now
            fusion = request.plan.fusion
            if fusion is None or threshold <= 0:
                batches.append([request])
                continue
            bucket_key = (key[0], fusion.key)
            nbytes = fusion.array.nbytes
            bucket = open_buckets.get(bucket_key)
            if bucket is None or bucket[0] + nbytes > threshold:
                bucket = open_buckets[bucket_key] = [0, []]
                batches.append(bucket[1])
            bucket[0] += nbytes
            bucket[1].append(request)
        for batch in batches:
            self._run_batch(batch)

    def _run_batch(self, batch: list) -> None:
        comm = self.state.process_sets.lookup(batch[0].key[0]).engine_comm
        timeline = self.timeline
        if timeline is not None:
            names = [str(request.key[1]) for request in batch]
            start = time.monotonic()
            for name, request in zip(names, batch):
                timeline.span(name, "NEGOTIATE", request.submitted, request.agreed)
                timeline.span(name, "QUEUE", request.agreed, start)
        try:
            plan = batch[0].plan
            if plan.fusion is not None:
                phase = None if timeline is None else (lambda p: timeline.phase(names, p))
                entries = [r.plan.fusion for r in batch]
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
            self._in_flight.difference_update(request.key for request in requests)
        self._finished.finish(requests, results, error)

    def _update_join(self, joined_ranks: set) -> None:
        if len(joined_ranks) < self.comm.size:
            self._joined_before = joined_ranks
            return
        # The last: the rank whose join was first agreed in this cycle; the highest if several.
        last = max(joined_ranks - self._joined_before or joined_ranks)
        self._joined_before = set()
        with self._lock:
            self._joined, self._join_result = False, last

    def _stop_all(self, error: Exception) -> None:
        with self._cycled:  # and no waiter waits for a cycle any more
            self._stopped = error
            requests = list(self._pending.values()) + self._incoming
            self._pending, self._incoming = {}, []
            self._cycled.notify_all()
        for request in requests:  # each error names its own collective
            self._finish([request], error=type(error)(f"{describe(request.plan.fields)}: {error}"))
