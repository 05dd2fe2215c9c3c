"""The one process-wide State: communicators, init() and shutdown().

All mutable global state lives in one `State` object; every getter goes through `current()`, the
single "not initialized" guard.
"""

import atexit
import sys
import threading
import time
from typing import NamedTuple, Optional

from mpi4py import MPI

from .exceptions import NotInitializedError

__all__ = [
    "State",
    "current",
    "init",
    "shutdown",
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


class State:
    """Communicators of one initialized horovodlite job.

    `comm` is a private duplicate of the user's communicator, so the library's messages can
    never match the user's own. `local_comm` groups the ranks of one host, `cross_comm` the
    ranks with the same local rank across hosts.
    """

    def __init__(self, user_comm: MPI.Comm):
        from .agreement import metadata_check_from_environment  # both build on this module
        from .algorithms import algorithm_from_environment

        # Settings are read once, first (a bad value fails before any communicator exists): an
        # environment lookup per call would cost more than a small all-reduce may.
        self.check_metadata = metadata_check_from_environment()
        self.allreduce_algorithm = algorithm_from_environment()
        self.comm = user_comm.Dup()
        self.local_comm = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.comm.rank)
        self.cross_comm = self.comm.Split(color=self.local_comm.rank, key=self.comm.rank)
        local_sizes = self.comm.allgather(self.local_comm.size)
        self.homogeneous = len(set(local_sizes)) == 1
        self.process_sets: dict = {
            0: ProcessSetComms(tuple(range(self.comm.size)), self.comm, self.comm.Dup())
        }
        self.next_process_set_id = 1
        self.engine = None  # started by init(), after this state exists

    def close(self) -> None:
        """Release every communicator this state created."""
        if self.engine is not None:
            self.engine.stop()
        for entry in self.process_sets.values():
            for comm in (entry.comm, entry.engine_comm):
                if comm is not None and comm is not self.comm:
                    comm.Free()
        self.process_sets.clear()
        for comm in (self.cross_comm, self.local_comm, self.comm):
            comm.Free()


_state = None
_lock = threading.Lock()
_atexit_registered = False


def current() -> State:
    """Return the initialized State, or raise telling the user to call init()."""
    state = _state
    if state is None:
        raise NotInitializedError()
    return state


def init(comm=None, process_sets=None) -> None:
    """Initialize horovodlite on `comm` (default: all MPI ranks); a second call does nothing.

    Args:
        comm: an mpi4py communicator (duplicated), or a list of COMM_WORLD ranks to run on.
        process_sets: ProcessSet objects to register now, as add_process_set() would.
    """
    global _state, _atexit_registered
    with _lock:
        if _state is not None:
            return
        from .engine import Engine  # the engine builds on this module

        state = State(_user_communicator(comm))
        state.engine = Engine(state)
        _state = state
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
    if process_sets and process_sets != "dynamic":
        from .process_sets import add_process_set

        for process_set in process_sets:
            add_process_set(process_set)


def _user_communicator(comm) -> MPI.Comm:
    if comm is None:
        return MPI.COMM_WORLD
    if isinstance(comm, MPI.Comm):
        return comm
    try:
        ranks = sorted({int(r) for r in comm})
    except TypeError:
        raise TypeError(
            f"init(comm=...) takes an mpi4py communicator or a list of ranks, "
            f"got {type(comm).__name__}"
        ) from None
    world = MPI.COMM_WORLD
    if not ranks or ranks[0] < 0 or ranks[-1] >= world.size:
        raise ValueError(f"init(comm={ranks}): ranks must lie in 0..{world.size - 1}")
    if world.rank not in ranks:
        raise ValueError(
            f"rank {world.rank} called init(comm={ranks}) but is not in it: "
            f"only the listed ranks may call init"
        )
    group = world.Get_group().Incl(ranks)
    try:
        return world.Create_group(group)
    finally:
        group.Free()


def shutdown() -> None:
    """Release horovodlite's communicators; safe to call twice."""
    global _state
    with _lock:
        state, _state = _state, None
    if state is not None and not MPI.Is_finalized():
        state.close()


def _at_exit() -> None:
    """Shut down at interpreter exit; after an uncaught exception, abort the whole job instead.

    MPICH's MPI_Finalize waits for the other ranks, which may be blocked in a collective that
    this rank will never join: the job would hang. Aborting ends it with a non-zero exit, as
    `python -m mpi4py` does.
    """
    failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if failed is not None and not hasattr(sys, "ps1") and _state is not None:
        sys.stderr.write(
            f"horovodlite: rank {_state.comm.rank} exits on an uncaught {type(failed).__name__}: "
            "aborting the job\n"
        )
        sys.stderr.flush()
        # The abort tears the job down at once, and the launcher may drop output it has not
        # forwarded yet (this line, the traceback): give it a moment on this failure path.
        time.sleep(0.5)
        MPI.COMM_WORLD.Abort(1)
    shutdown()


def is_initialized() -> bool:
    """Return whether init() has been called (and shutdown() has not)."""
    return _state is not None


def size() -> int:
    """Return the number of ranks."""
    return current().comm.size


def rank() -> int:
    """Return this process's rank."""
    return current().comm.rank


def local_size() -> int:
    """Return the number of ranks on this host."""
    return current().local_comm.size


def local_rank() -> int:
    """Return this process's rank among the ranks on its host."""
    return current().local_comm.rank


def cross_size() -> int:
    """Return the number of hosts that have a rank with this process's local rank."""
    return current().cross_comm.size


def cross_rank() -> int:
    """Return this process's rank among the ranks with the same local rank."""
    return current().cross_comm.rank


def is_homogeneous() -> bool:
    """Return whether every host runs the same number of ranks."""
    return current().homogeneous


def mpi_threads_supported() -> bool:
    """Return whether MPI was initialized with MPI_THREAD_MULTIPLE."""
    current()  # Horovod raises before init here too
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE
