"""Process sets: the user's handles on subgroups of the ranks that collectives can run on.

The communicators behind them live in the state's registry (state.ProcessSetRegistry); this
module validates the user's requests, agrees on them across ranks, and looks sets up for the
collectives.
"""

import functools

from mpi4py import MPI

from . import state as _state
from .agreement import agree, digest

__all__ = [
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "communicator",
    "process_set_ranks",
]


class ProcessSet:
    """A subgroup of ranks that collectives can run on (`process_set=`).

    Args:
        ranks_or_comm: the global ranks in the set, or an mpi4py communicator whose ranks form it.
    """

    def __init__(self, ranks_or_comm):
        self.process_set_id = None
        if isinstance(ranks_or_comm, MPI.Comm):
            self._mpi_comm, self._ranks = ranks_or_comm, None
        else:
            self._mpi_comm = None
            try:
                self._ranks = sorted({int(r) for r in ranks_or_comm})
            except TypeError:
                raise TypeError(
                    "ProcessSet takes a list of ranks or an mpi4py communicator, "
                    f"got {type(ranks_or_comm).__name__}"
                ) from None

    @property
    def ranks(self) -> list:
        """The global ranks in this set, in order."""
        if self.process_set_id is not None:
            return process_set_ranks(self.process_set_id)
        if self._ranks is None:
            self._ranks = _translate(self._mpi_comm)
        return list(self._ranks)

    def size(self) -> int:
        """Return the number of ranks in the set."""
        return len(self.ranks)

    def rank(self) -> int:
        """Return this process's rank within the set, or -1 if it is not a member."""
        me = _state.rank()
        ranks = self.ranks
        return ranks.index(me) if me in ranks else -1

    def included(self) -> bool:
        """Return whether this process is in the set."""
        return self.rank() >= 0

    def __repr__(self) -> str:
        ranks = self._ranks if self.process_set_id is None else self.ranks
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={ranks})"


class _GlobalProcessSet(ProcessSet):
    def __init__(self):
        super().__init__([])
        self.process_set_id = 0

    def __repr__(self) -> str:
        return "global_process_set"


global_process_set = _GlobalProcessSet()


def _translate(comm: MPI.Comm) -> list:
    world = _state.current().comm
    return sorted(MPI.Group.Translate_ranks(comm.Get_group(), range(comm.size), world.Get_group()))


def add_process_set(process_set) -> ProcessSet:
    """Register a process set; every rank must call this with the same ranks.

    Returns the registered ProcessSet (a new one when given a list of ranks).
    """
    state = _state.current()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    error = None
    if process_set.process_set_id is not None:
        error = ValueError(f"{process_set!r} is already registered")
    ranks = process_set.ranks if error is None else []
    if error is None and (not ranks or ranks[0] < 0 or ranks[-1] >= state.comm.size):
        error = ValueError(f"process set ranks {ranks} must lie in 0..{state.comm.size - 1}")
    fields = {"collective": "add_process_set", "ranks": tuple(ranks)}
    agree(state.comm, fields, error, check=state.settings.check_metadata, wait=_wait(state, fields))
    process_set.process_set_id = state.process_sets.add(tuple(ranks))
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set on every rank; return whether it was registered."""
    state = _state.current()
    if process_set.process_set_id in (None, 0):
        return False
    fields = {"collective": "remove_process_set", "id": process_set.process_set_id}
    agree(state.comm, fields, check=state.settings.check_metadata, wait=_wait(state, fields))
    entry = state.process_sets.remove(process_set.process_set_id)
    if entry is not None:
        process_set._ranks = list(entry.ranks)
    process_set.process_set_id = None
    return entry is not None


def _wait(state, fields: dict):
    """Return wait(request) for registering a process set, a collective over all ranks."""
    what = f"{fields['collective']} {fields.get('ranks', fields.get('id'))}"
    return functools.partial(
        state.watch.wait, about=lambda: (what, digest(fields)), members=range(state.comm.size)
    )


def communicator(process_set) -> tuple:
    """Return (communicator, global ranks) for `process_set`; this rank must be a member.

    Raises:
        TypeError: `process_set` is not a ProcessSet.
        ValueError: it is not registered, or this rank is not in it.
    """
    state = _state.current()
    if process_set is None:
        process_set = global_process_set
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    entry = state.process_sets.lookup(process_set.process_set_id)
    if entry is None:
        raise ValueError(
            f"{process_set!r} is not registered: call hvd.add_process_set() on every rank first"
        )
    ranks, comm, _ = entry
    if comm is None:
        raise ValueError(
            f"rank {state.comm.rank} is not in process set {list(ranks)}: "
            "only its members may call collectives on it"
        )
    return comm, ranks


def process_set_ranks(process_set_id: int) -> list:
    """Return the global ranks of the registered process set `process_set_id`.

    Raises:
        ValueError: no process set has that id.
    """
    entry = _state.current().process_sets.lookup(process_set_id)
    if entry is None:
        raise ValueError(
            f"no process set has id {process_set_id}: register it with hvd.add_process_set() "
            "on every rank first"
        )
    return list(entry.ranks)
