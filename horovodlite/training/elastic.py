"""Elastic training's state: Horovod's `hvd.elastic` API, restart-based and framework-free.

MPI cannot shrink a running job, so a job resizes by restarting (horovodlite-run --min-np/
--max-np): the launcher ends every rank and starts the job again at the new size, and the
restarted ranks load the newest commit. `commit()` keeps the state in memory (Horovod's `save`)
and writes it to a folder of each rank's own (commit_store.py). `run(func)` restores the newest
commit any rank holds, syncs, calls `func`, and leaves the process with the status that tells
the launcher what happened. A binding gives `HandlerState` a function that wraps its framework's
objects (models, optimizers, samplers) in `StateHandler`s; everything else lives here.
"""

import copy
import functools
import os
import sys
from typing import Callable, Optional

import cloudpickle
from mpi4py import MPI

from .. import collectives, lifecycle
from .. import state as _state
from ..config import HOSTS_UPDATED_EXIT_CODE
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt, NotInitializedError
from .commit_store import CommitStore, commit_folder

__all__ = [
    "State",
    "ObjectState",
    "HandlerState",
    "StateHandler",
    "run",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "FAILURE_EXIT_CODE",
    "SHARED",
]

# The names every binding's hvd.elastic re-exports unchanged, beside its own states.
SHARED = ["run", "State", "ObjectState", "HorovodInternalError", "HostsUpdatedInterrupt"]

# The exit status of every rank that leaves run() on a HorovodInternalError (a peer died or a
# collective failed): the launcher counts a failure and restarts from the last commit.
FAILURE_EXIT_CODE = 1
_FORMAT = 1  # the layout of a commit's payload (a dict), in case it ever changes


class _Committed:
    """What a state and each of its handlers do with their values and the commit."""

    def save(self) -> None:
        """Keep the current values as the committed ones."""
        raise NotImplementedError

    def restore(self) -> None:
        """Set the values back to the last commit."""
        raise NotImplementedError

    def sync(self) -> None:
        """Give every rank rank 0's values (collective)."""
        raise NotImplementedError


class State(_Committed):
    """Horovod's elastic state: what `commit()` keeps and `restore()` brings back.

    Subclasses define `save()` (keep the current values as the commit), `restore()` (go back to
    the commit), `sync()` (make every rank's values rank 0's), and for durable commits
    `_snapshot()`/`_load_snapshot()` (the committed values as one picklable object, and back).

    Args:
        bcast_object: broadcasts a picklable object from rank 0 (default: the core's).
        get_rank: returns this process's rank (default: the core's).
    """

    def __init__(self, bcast_object: Optional[Callable] = None, get_rank=None):
        self._bcast_object = bcast_object or (lambda obj: collectives.broadcast_object(obj, 0))
        self._rank = get_rank or _state.rank
        self._reset_callbacks: list = []
        self._commit_number = 0
        if _state.is_initialized():
            hosts_counter_at_start()  # as early as possible: a later change means new hosts

    @property
    def commit_number(self) -> int:
        """The number of the last commit, counted across restarts of the job (0: none yet)."""
        return self._commit_number

    def register_reset_callbacks(self, callbacks) -> None:
        """Call each of `callbacks` (no arguments) after the state was restored in a restart."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run `reset()`, then the registered reset callbacks in order."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep the current values in memory and on disk, then check for new hosts.

        Collective: every rank calls it at the same point. The durable copy (where a job id is
        set) is written before the host check, so a job that grows restarts from this commit.

        Raises:
            HostsUpdatedInterrupt: on every rank, if the launcher found new hosts.
        """
        self.save()
        self._commit_number += 1
        _write_durable(self)
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank if the elastic launcher found new hosts.

        Rank 0 reads the launcher's hosts-update file and broadcasts the decision, so every
        rank decides alike. Outside an elastic launch this does nothing and communicates nothing.
        """
        hosts_file = _state.current().settings.elastic_hosts_file
        if not hosts_file:
            return
        news = None
        if _state.rank() == 0:
            try:
                counter = _read_counter(hosts_file)
                news = (counter is not None and counter != hosts_counter_at_start(), None)
            except ValueError as exc:
                news = (False, str(exc))
        changed, error = collectives.broadcast_object(news, 0, name="elastic.hosts_updated")
        if error is not None:
            raise ValueError(error)
        if changed:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def reset(self) -> None:
        """Adapt to a new job (a restart, maybe at a new size); called before the callbacks."""

    def _snapshot(self):
        """Return the committed values as one picklable object."""
        raise NotImplementedError

    def _load_snapshot(self, snapshot) -> None:
        """Make `snapshot` (from `_snapshot()`) the committed values; `restore()` applies them."""
        raise NotImplementedError


class ObjectState(State):
    """A state of plain picklable attributes: `ObjectState(epoch=0, batch=0)`, `state.epoch`.

    `save()` keeps deep copies of the attributes named at construction, so later changes to a
    mutable value (a list, a dict) do not reach the commit.
    """

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)
        self._set_attrs()

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        # As Horovod: rank 0's committed values win, and become every rank's current ones.
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def _snapshot(self):
        return {"objects": self._saved_state}

    def _load_snapshot(self, snapshot) -> None:
        self._saved_state = dict(snapshot["objects"])


class StateHandler(_Committed):
    """One framework object of a state (a model, an optimizer, a sampler) and its commit.

    `value` is the object itself; `saved` its committed contents, picklable (a state dict,
    a list of arrays). Subclasses implement `save`, `restore` and `sync`.
    """

    def __init__(self, value):
        self.value = value
        self.saved = None
        self.save()

    def set_value(self, value) -> None:
        """Replace the object (`state.model = new_model`) and commit its contents."""
        self.value = value
        self.save()


class HandlerState(ObjectState):
    """An ObjectState whose framework objects are committed by their StateHandlers.

    Args:
        handler_for: returns the StateHandler for a value, or None for a plain attribute.
        kwargs: the state's values by name (`model=`, `optimizer=`, `epoch=`...); None values
            are plain attributes.
    """

    def __init__(self, handler_for: Callable, bcast_object=None, get_rank=None, **kwargs):
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = handler_for(value) if value is not None else None
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=bcast_object, get_rank=get_rank, **plain)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        self._show_values()
        super().restore()

    def sync(self) -> None:
        # Rank 0's values become the commit too, as for the plain attributes: a restore() before
        # the next commit must not take a rank back to the values it had before the sync.
        for handler in self._handlers.values():
            handler.sync()
            handler.save()
        self._show_values()
        super().sync()

    def _show_values(self) -> None:
        """Point the attributes at the handlers' values: a handler of immutable values (JAX's
        pytrees) replaces them on restore and sync, where torch's restores its objects in place."""
        for name, handler in self._handlers.items():
            object.__setattr__(self, name, handler.value)

    def _snapshot(self):
        snapshot = super()._snapshot()
        snapshot["handlers"] = {name: h.saved for name, h in self._handlers.items()}
        return snapshot

    def _load_snapshot(self, snapshot) -> None:
        super()._load_snapshot(snapshot)
        saved = snapshot.get("handlers", {})
        missing = sorted(set(self._handlers) - set(saved))
        if missing:
            raise ValueError(
                f"the commit has no {', '.join(missing)}: the state was built with other values "
                f"than the job that committed ({', '.join(sorted(saved)) or 'none'})"
            )
        for name, handler in self._handlers.items():
            handler.saved = saved[name]


# ---------------------------------------------------------------------------------------------
# Durable commits and the restore agreement.


def _store() -> Optional[CommitStore]:
    """Return this rank's commit store, or None outside an elastic job (memory-only commits)."""
    settings = _state.current().settings
    if not settings.elastic_job_id:
        return None
    return CommitStore(commit_folder(settings.elastic_dir, settings.elastic_job_id, _state.rank()))


def _write_durable(state: State) -> None:
    store = _store()
    if store is None:
        return
    payload = {
        "format": _FORMAT,
        "commit": state.commit_number,
        "size": _state.size(),
        "restart": _state.current().settings.elastic_restart,
        "state": state._snapshot(),
    }
    store.write(state.commit_number, cloudpickle.dumps(payload))


def restore_newest(state: State) -> Optional[dict]:
    """Load the newest commit that any rank holds into `state`, if newer than its own.

    Collective. Every rank reads its newest intact commit file; one allgather of the numbers
    picks the newest, whose lowest holder broadcasts the bytes; ranks that lacked them store
    them too. Returns the commit's record ({"commit", "size", "restart"}), or None if there was
    nothing newer to load.
    """
    store = _store()
    if store is None:
        return None
    number, payload = store.newest()
    numbers = collectives.allgather_object(number, name="elastic.commit_numbers")
    newest = max(numbers)
    if newest <= state.commit_number:
        return None
    holder = numbers.index(newest)
    payload = collectives.broadcast_object(
        payload if _state.rank() == holder else None, holder, name="elastic.commit"
    )
    if number != newest:
        store.write(newest, payload)
    record = cloudpickle.loads(payload)
    if record.get("format") != _FORMAT:
        raise ValueError(f"commit {newest} has format {record.get('format')}, expected {_FORMAT}")
    state._load_snapshot(record["state"])
    state._commit_number = record["commit"]
    state.restore()
    return {key: record[key] for key in ("commit", "size", "restart")}


# ---------------------------------------------------------------------------------------------
# The hosts-update file.

_hosts_counter = ...  # read once per process: the counter when this run started


def _read_counter(path: str) -> Optional[int]:
    """Return the counter in the launcher's hosts-update file, or None if there is no file yet.

    Raises:
        ValueError: the file holds something other than one integer.
    """
    try:
        with open(path) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text.splitlines()[0]) if text else None
    except ValueError:
        raise ValueError(
            f"the elastic hosts-update file {path} should hold one integer, got {text[:40]!r}"
        ) from None


def hosts_counter_at_start() -> Optional[int]:
    """Return the hosts-update counter when this run started.

    The launcher passes it (ELASTIC_HOSTS_BASELINE), so a bump at any time after the launch is
    seen; without it, the counter as this process first read it (at run() or a check). Only
    rank 0's reading decides. A missing file counts as "no counter", and any counter seen later
    then means new hosts; a malformed one is reported by the first check, on every rank.
    """
    global _hosts_counter
    settings = _state.current().settings
    if settings.elastic_hosts_baseline is not None:
        return settings.elastic_hosts_baseline
    if _hosts_counter is ...:
        path = settings.elastic_hosts_file
        try:
            _hosts_counter = _read_counter(path) if path else None
        except ValueError:
            _hosts_counter = None
    return _hosts_counter


# ---------------------------------------------------------------------------------------------
# run()


def run(func: Callable) -> Callable:
    """Decorate `func(state, ...)`, the training function of an elastic job.

    The wrapper restores the newest durable commit that any rank holds (then runs the state's
    reset callbacks, as Horovod does after every reset), syncs the state from rank 0, and calls
    `func`. When `func` raises HostsUpdatedInterrupt (on every rank alike), horovodlite shuts
    down and the process exits with HOSTS_UPDATED_EXIT_CODE: the launcher restarts the job at
    the larger size from this commit. When it raises HorovodInternalError (a rank died, a
    collective failed), the job is aborted with FAILURE_EXIT_CODE and the launcher restarts it
    from the last commit. Outside horovodlite-run both simply end the job.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        hosts_counter_at_start()  # the baseline that later checks compare with
        try:
            if restore_newest(state) is not None:
                state.on_reset()
            state.sync()
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            _say(f"new hosts at commit {state.commit_number}: leaving to restart larger")
            lifecycle.shutdown()
            sys.exit(HOSTS_UPDATED_EXIT_CODE)
        except NotInitializedError:
            raise  # a mistake in the script, not a failure a restart would mend
        except HorovodInternalError as exc:
            _say(f"{exc}; the job restarts from commit {state.commit_number}")
            _abort(FAILURE_EXIT_CODE)

    return wrapper


def _say(message: str) -> None:
    rank = _state.rank() if _state.is_initialized() else "?"
    sys.stderr.write(f"horovodlite elastic: rank {rank}: {message}\n")
    sys.stderr.flush()


def _abort(code: int) -> None:
    """End every rank now: a rank that waits on the dead one would otherwise hang at MPI exit."""
    sys.stdout.flush()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.COMM_WORLD.Abort(code)
    os._exit(code)
