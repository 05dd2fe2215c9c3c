"""The one process-wide State: settings, communicators and the process-set registry.

All mutable global state lives in one `State` object; every getter goes through `current()`, the
single "not initialized" guard. `init()` and `shutdown()` (lifecycle.py) create and close it.
"""

import os
from typing import Any, Callable, NamedTuple, Optional

from mpi4py import MPI

from . import agreement
from .config import Settings
from .exceptions import NotInitializedError
from .hosts import cores_per_rank
from .waiting import Watch

__all__ = [
    "ProcessSetComms",
    "ProcessSetRegistry",
    "State",
    "activate",
    "deactivate",
    "current",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "cross_size",
    "cross_rank",
    "is_homogeneous",
    "mpi_threads_supported",
]


class ProcessSetComms(NamedTuple):
    """A registered process set: its global ranks and this rank's communicators on it.

    `comm` carries synchronous collectives and `engine_comm` the engine's, so the two can never
    match each other's messages. Both are None where this rank is not a member.
    """

    ranks: tuple
    comm: Optional[MPI.Comm]
    engine_comm: Optional[MPI.Comm]


class ProcessSetRegistry:
    """The registered process sets by id, the same ids on every rank; 0 is all ranks."""

    def __init__(self, world: MPI.Comm):
        self._world = world
        self._sets = {0: ProcessSetComms(tuple(range(world.size)), world, world.Dup())}
        self._next_id = 1

    def lookup(self, process_set_id) -> Optional[ProcessSetComms]:
        """Return the registered set `process_set_id`, or None."""
        return self._sets.get(process_set_id)

    def registered(self) -> list:
        """Return every registered set, the global one first."""
        return [self._sets[i] for i in sorted(self._sets)]

    def add(self, ranks: tuple) -> int:
        """Create the communicators of global `ranks` and return the new set's id.

        Collective over all ranks, which must pass the same `ranks` (agreed beforehand).
        """
        group = self._world.Get_group().Incl(list(ranks))
        try:
            comm = self._world.Create(group)  # COMM_NULL for non-members
        finally:
            group.Free()
        member = comm != MPI.COMM_NULL
        process_set_id, self._next_id = self._next_id, self._next_id + 1
        self._sets[process_set_id] = ProcessSetComms(
            tuple(ranks), _bound(comm) if member else None, comm.Dup() if member else None
        )
        return process_set_id

    def remove(self, process_set_id: int) -> Optional[ProcessSetComms]:
        """Unregister set `process_set_id` and free its communicators; return it, or None."""
        entry = self._sets.pop(process_set_id, None)
        if entry is not None:
            _free(entry, keep=self._world)
        return entry

    def close(self) -> None:
        """Free every communicator of every set."""
        for entry in self._sets.values():
            _free(entry, keep=self._world)
        self._sets.clear()


def _free(entry: ProcessSetComms, keep: MPI.Comm) -> None:
    for comm in (entry.comm, entry.engine_comm):
        if comm is not None and comm is not keep:
            _freed(comm)


def _bound(comm: MPI.Comm) -> MPI.Comm:
    """Return `comm`, its metadata checks bound to one persistent all-gather (agreement.bind):
    every communicator that carries synchronous collectives, as it is made (a collective call;
    the engine's agree by their own exchange, negotiation.py)."""
    agreement.bind(comm)
    return comm


def _freed(comm: MPI.Comm) -> None:
    agreement.release(comm)
    comm.Free()


class State:
    """Settings and communicators of one initialized horovodlite job.

    `comm` is a private duplicate of the user's communicator, so the library's messages can
    never match the user's own. `local_comm` groups the ranks of one host, `cross_comm` the
    ranks with the same local rank across hosts. `generation` counts the init() calls of this
    process (the same on every rank). `watch` does every wait on other ranks and
    reads their notices on a communicator of its own (waiting.py). `engine` is the engine thread
    that init() starts once this state exists (lifecycle.py).
    """

    def __init__(self, user_comm: MPI.Comm, settings: Settings, generation: int = 0):
        self.settings, self.generation = settings, generation
        self.comm = _bound(user_comm.Dup())
        self.local_comm = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.comm.rank)
        self.cross_comm = self.comm.Split(color=self.local_comm.rank, key=self.comm.rank)
        self.cores_per_rank = cores_per_rank(self.local_comm)
        local_sizes = self.comm.allgather(self.local_comm.size)
        self.homogeneous = len(set(local_sizes)) == 1
        self.process_sets = ProcessSetRegistry(self.comm)
        self.watch = Watch(
            self.comm.Dup(), settings.collective_timeout, settings.stall_check, generation,
            waiting_marker=_waiting_marker(settings.exit_report_dir),
            cores_per_rank=self.cores_per_rank,
        )  # fmt: skip
        self.engine: Any = None

    def close(self) -> None:
        """Release every communicator this state created (the engine must have stopped)."""
        self.process_sets.close()
        self.watch.close()
        for comm in (self.watch.comm, self.cross_comm, self.local_comm, self.comm):
            _freed(comm)


_state: Optional[State] = None


def activate(state: State) -> None:
    """Make `state` the process's current state (init() does this once it is complete)."""
    global _state
    _state = state


def deactivate() -> Optional[State]:
    """Forget the current state and return it (or None): the start of shutdown()."""
    global _state
    state, _state = _state, None
    return state


def current() -> State:
    """Return the initialized State, or raise telling the user to call init()."""
    state = _state
    if state is None:
        raise NotInitializedError()
    return state


def is_initialized() -> bool:
    """Return whether init() has been called (and shutdown() has not)."""
    return _state is not None


def _reader(name: str, read: Callable[[State], Any], doc: str) -> Callable[[], Any]:
    """Return the getter `name`: `read` applied to the current state (raises before init)."""

    def getter():
        return read(current())

    getter.__name__ = getter.__qualname__ = name
    getter.__doc__ = doc
    return getter


size = _reader("size", lambda s: s.comm.size, "Return the number of ranks.")
rank = _reader("rank", lambda s: s.comm.rank, "Return this process's rank.")
local_size = _reader(
    "local_size", lambda s: s.local_comm.size, "Return the number of ranks on this host."
)
local_rank = _reader(
    "local_rank",
    lambda s: s.local_comm.rank,
    "Return this process's rank among the ranks on its host.",
)
cross_size = _reader(
    "cross_size",
    lambda s: s.cross_comm.size,
    "Return the number of hosts that have a rank with this process's local rank.",
)
cross_rank = _reader(
    "cross_rank",
    lambda s: s.cross_comm.rank,
    "Return this process's rank among the ranks with the same local rank.",
)
is_homogeneous = _reader(
    "is_homogeneous",
    lambda s: s.homogeneous,
    "Return whether every host runs the same number of ranks.",
)


def mpi_threads_supported() -> bool:
    """Return whether MPI was initialized with MPI_THREAD_MULTIPLE."""
    current()  # Horovod raises before init here too
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def _waiting_marker(folder):
    """The file whose presence tells horovodlite-run's exit watch that this rank waits on others."""
    if not folder:
        return None
    return os.path.join(folder, f"rank-{MPI.COMM_WORLD.Get_rank()}.waiting")
