"""init() and shutdown(): build the State and start the engine, then take both down again.

The top of the core: the one module that knows every part a running job needs (settings,
state, engine, process sets), so none of those parts has to import upward to create another.
"""

import atexit
import contextlib
import os
import socket
import sys
import threading
import time

from mpi4py import MPI

from . import result_memory
from . import state as _state
from .config import Settings
from .engine import Engine
from .process_sets import add_process_set
from .waiting import LEFT_EXIT, LEFT_SHUTDOWN, teardown_pending

__all__ = ["init", "shutdown"]

_lock = threading.Lock()
_atexit_registered = False
_inits = 0  # init() calls so far: every rank counts the same


def init(comm=None, process_sets=None) -> None:
    """Initialize horovodlite on `comm` (default: all MPI ranks); a second call does nothing.

    Args:
        comm: an mpi4py communicator (duplicated), or a list of COMM_WORLD ranks to run on.
        process_sets: ProcessSet objects to register now, as add_process_set() would.

    Raises:
        ValueError: a HOROVODLITE_* setting is bad (before any communicator is made), or `comm`
            lists ranks that do not exist or exclude this one.
    """
    global _atexit_registered, _inits
    with _lock:
        if _state.is_initialized():
            return
        settings = Settings.from_environment()
        _inits += 1
        state = _state.State(_user_communicator(comm), settings, _inits)
        state.engine = Engine(state)
        _state.activate(state)
        _note_exit_report(settings, "started")
        if not _atexit_registered:
            atexit.register(_at_exit)
            _atexit_registered = True
    if process_sets and process_sets != "dynamic":
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
    """Stop the engine and release horovodlite's communicators; safe to call twice.

    The other ranks learn that this one left: a collective they wait in that needs this rank
    raises there instead of waiting forever.
    """
    _shutdown(LEFT_SHUTDOWN)


def _shutdown(reason: int) -> None:
    with _lock:
        state = _state.deactivate()
    if state is not None:
        _note_exit_report(state.settings, "left")
    if state is not None and not MPI.Is_finalized():
        state.watch.announce_departure(reason)
        state.engine.stop()
        state.close()
    result_memory.release()  # (results still alive keep theirs)


def _note_exit_report(settings: Settings, event: str) -> None:
    """Tell horovodlite-run's exit watch (run/exit_watch.py) that this rank started or left.

    `started` writes this process's pid; `left` marks an orderly leave, after which the end of
    the process is no news. Only where the launcher asked for it, and never an error: on a
    remote host the folder does not exist, and there is nobody to tell.
    """
    if not settings.exit_report_dir:
        return
    path = os.path.join(settings.exit_report_dir, f"rank-{MPI.COMM_WORLD.Get_rank()}")
    try:
        if event == "started":
            with open(path + ".part", "w") as f:
                f.write(f"{os.getpid()} {socket.gethostname()}\n")
            os.replace(path + ".part", path)  # whole or absent for the watch
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + ".left")
        else:
            open(path + ".left", "w").close()
    except OSError:
        pass


def _at_exit() -> None:
    """Shut down at interpreter exit; after an uncaught exception, abort the whole job instead.

    MPICH's MPI_Finalize waits for the other ranks, which may be blocked in a collective that
    this rank will never join: the job would hang. Aborting ends it with a non-zero exit, as
    `python -m mpi4py` does. So does a rank whose failed collective is still posted (caught
    errors of a departure or a timeout): MPI_Finalize would meet its messages unreceived.
    """
    failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if failed is not None and not hasattr(sys, "ps1") and _state.is_initialized():
        sys.stderr.write(
            f"horovodlite: rank {_state.rank()} exits on an uncaught {type(failed).__name__}: "
            "aborting the job\n"
        )
        sys.stderr.flush()
        # The abort tears the job down at once, and the launcher may drop output it has not
        # forwarded yet (this line, the traceback): give it a moment on this failure path.
        _note_exit_report(_state.current().settings, "left")  # it has named itself, above
        time.sleep(0.5)
        MPI.COMM_WORLD.Abort(1)
    if teardown_pending() and not MPI.Is_finalized():
        # A collective failed and stays posted here (the error was caught): MPI_Finalize would
        # meet its messages unreceived (a warning on MPICH over UCX, a hang or a crash on other
        # MPIs). The job is being torn down anyway: do it now.
        sys.stderr.write(
            f"horovodlite: rank {MPI.COMM_WORLD.Get_rank()} exits after a failed collective "
            "that is still posted: aborting the job rather than finalizing MPI\n"
        )
        sys.stderr.flush()
        if _state.is_initialized():
            _note_exit_report(_state.current().settings, "left")  # it has named itself
        time.sleep(0.5)  # as below: let the launcher forward the output first
        MPI.COMM_WORLD.Abort(1)
    _shutdown(LEFT_EXIT)
