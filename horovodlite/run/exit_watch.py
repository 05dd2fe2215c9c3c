"""Name the rank that ended a job without leaving horovodlite: os._exit, a signal, a crash.

Such a process runs no Python on its way out, and the MPI launcher then kills the other ranks
before they can say anything (measured: MPICH's Hydra reports the pid of a rank it killed).
So horovodlite-run watches from outside: each rank of this host writes its pid to a private
folder at init(), marks an orderly leave at shutdown (lifecycle.py) and marks the waits on
other ranks that last (waiting.py); a thread here waits on the ranks' processes through pidfds.
If the job fails, the launcher names the first rank that ended without leaving and was not
waiting on others. Ranks on other hosts are not watched.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import tempfile
import threading

__all__ = ["ExitWatch"]

_VARIABLE = "HOROVODLITE_EXIT_REPORT_DIR"
_POLL = 0.05  # seconds between looks for newly started ranks


class ExitWatch:
    """A context manager: watches the job's local ranks while it runs."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="horovodlite-ranks-")
        self._ended: list = []  # (batch, rank, pid) of ranks that ended without leaving
        self._batch = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="horovodlite-exit-watch",
                                        daemon=True)  # fmt: skip
        self._pidfds: dict = {}  # fd -> (rank, pid)
        self._seen: set = set()

    @property
    def environment(self) -> dict:
        """The variable every rank needs to report to this watch."""
        return {_VARIABLE: self.folder}

    def __enter__(self) -> ExitWatch:
        if hasattr(os, "pidfd_open"):  # Linux 5.3 and later: elsewhere nothing is named
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._finish()
        shutil.rmtree(self.folder, ignore_errors=True)

    def message(self) -> str | None:
        """Say which rank ended the job without leaving horovodlite, if one did.

        Call it once the job has ended. A rank that died while it waited on others (it had
        marked its wait, waiting.py) was killed after the one that ended the job: among the
        ranks that ended without leaving, the first that was not waiting is named, else the
        first to be seen.
        """
        first = self.culprits()
        if not first:
            return None
        named = ", ".join(f"rank {rank} (pid {pid})" for rank, pid in first)
        return (
            f"{named} ended without leaving horovodlite (os._exit, a signal such as SIGKILL "
            "or the out-of-memory killer, or a crash) while the job ran; the MPI launcher then "
            "stopped the other ranks"
        )

    def culprits(self) -> list:
        """Return the (rank, pid) pairs that message() names, sorted; empty if none.

        Call it once the job has ended.
        """
        self._finish()
        culprits = [e for e in self._ended if not self._marked(e[1], "waiting")] or self._ended
        if not culprits:
            return []
        return sorted((rank, pid) for batch, rank, pid in culprits if batch == culprits[0][0])

    def _finish(self) -> None:
        """Stop the thread, then note what ended since its last look."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._pidfds:
            self._collect(0)
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds.clear()

    def _watch(self) -> None:
        host = socket.gethostname()
        while not self._stop.is_set():
            self._open_new(host)
            if self._pidfds:
                self._collect(_POLL)
            else:
                self._stop.wait(_POLL)

    def _collect(self, timeout: float) -> None:
        ready, _, _ = select.select(list(self._pidfds), [], [], timeout)
        ended = [self._pidfds.pop(fd) for fd in ready]
        for fd in ready:
            os.close(fd)
        self._note(ended)

    def _open_new(self, host: str) -> None:
        gone = []
        for name in os.listdir(self.folder):
            if not name.startswith("rank-") or "." in name or name in self._seen:
                continue
            self._seen.add(name)
            try:
                with open(os.path.join(self.folder, name)) as f:
                    pid_text, rank_host = f.read().split()
                rank, pid = int(name[len("rank-") :]), int(pid_text)
            except (OSError, ValueError):
                continue
            if rank_host != host:
                continue
            try:
                self._pidfds[os.pidfd_open(pid)] = (rank, pid)
            except ProcessLookupError:  # ended before we looked
                gone.append((rank, pid))
            except OSError:
                continue
        self._note(gone)

    def _marked(self, rank: int, what: str) -> bool:
        return os.path.exists(os.path.join(self.folder, f"rank-{rank}.{what}"))

    def _note(self, ended: list) -> None:
        unannounced = [(rank, pid) for rank, pid in ended if not self._marked(rank, "left")]
        if unannounced:
            self._batch += 1
            self._ended += [(self._batch, rank, pid) for rank, pid in unannounced]
