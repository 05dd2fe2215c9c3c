"""Elastic horovodlite-run: restart the job when a worker fails, resize it to the slots available.

MPI cannot shrink a running job portably, so the launcher works as torchrun's elastic agent
does. It starts the job with `mpiexec`; when the job ends abnormally it makes sure every rank
is gone, finds the slots available now (the discovery script, or the static host list minus
hosts whose workers failed in two runs in a row), and starts the job again at a size between
--min-np and --max-np; the workers restore their last commit. While the job runs, the
discovery script is polled; when it shows more usable slots than the job has (and the job is
below --max-np), the launcher bumps the counter in the hosts file, the workers leave at their
next commit with HOSTS_UPDATED_EXIT_CODE, and the job restarts at the larger size, not
counted as a failure.

Telling the two apart (measured with MPICH 5.0.2's Hydra): mpiexec exits with the bitwise OR
of the ranks' exit statuses, and with 9 when it killed the job because a rank died (SIGKILL,
or any rank exiting while others still run). 75 | 1 is 75, so a status of 75 alone cannot
prove that every rank left for new hosts: the launcher also requires that it asked for it
(it bumped the counter during this run) and that the exit watch saw no local rank end
without leaving horovodlite.

The contract with the workers (horovodlite/config.py): every rank gets HOROVODLITE_ELASTIC_JOB_ID
(the same across restarts), HOROVODLITE_ELASTIC_HOSTS_FILE and HOROVODLITE_ELASTIC_RESTART;
HOROVODLITE_ELASTIC_DIR passes through when set.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..config import HOSTS_UPDATED_EXIT_CODE
from ..training.commit_store import CommitStore
from .elastic_setup import DiscoveryError, ElasticOptions, discover_hosts, place, rank_hosts
from .errors import LaunchError
from .exit_watch import ExitWatch
from .hosts import Host, hosts_argument, is_local, launcher_hosts, ssh_probe

__all__ = ["ElasticLauncher", "NotEnoughSlots", "newest_commit"]

FAILURES_TO_EXCLUDE = 2  # a host whose workers failed in this many runs in a row is dropped
_STOP_GRACE = 10.0  # seconds mpiexec gets after SIGTERM before it is killed


class NotEnoughSlots(LaunchError):
    """Fewer than --min-np slots are available, and none came within --elastic-timeout."""


def newest_commit(folder: str) -> int | None:
    """Return the number of the newest intact commit any rank keeps in `folder`, or None.

    `folder` is {elastic_dir}/{job_id}; each rank keeps its commits in rank-R/ inside it
    (training/commit_store.py). Commit files are checked as the workers check them, newest
    first, so a file cut short is passed over as the workers pass it over.
    """
    try:
        ranks = [name for name in os.listdir(folder) if name.startswith("rank-")]
    except OSError:
        return None
    stores = [CommitStore(os.path.join(folder, name)) for name in ranks]
    candidates = sorted(
        ((number, store) for store in stores for number in store.numbers()),
        key=lambda pair: pair[0],
        reverse=True,
    )
    for number, store in candidates:
        if store.read(number) is not None:
            return number
    return None


def _commit_numbers_seen(folder: str) -> int:
    """Return the highest commit number any rank's file name in `folder` shows (-1: none).

    Cheap (file names only, no reading): the launcher looks every --discovery-interval.
    """
    try:
        ranks = [name for name in os.listdir(folder) if name.startswith("rank-")]
    except OSError:
        return -1
    numbers = [n for name in ranks for n in CommitStore(os.path.join(folder, name)).numbers()]
    return max(numbers, default=-1)


def _log(message: str) -> None:
    print(f"horovodlite-run: elastic: {message}", file=sys.stderr, flush=True)


def _describe(hosts: list) -> str:
    return hosts_argument(hosts) if hosts else "no hosts"


@dataclass
class _Outcome:
    status: int
    hosts_updated: bool
    reason: str
    failed_hosts: set = field(default_factory=set)


class ElasticLauncher:
    """Run a command elastically: restart on failure, grow when discovery finds slots.

    Args:
        options: the checked elastic flags.
        command: the program and its arguments.
        settings: HOROVODLITE_* variables every rank gets (see mpi_launcher.settings_env).
        mpi_args: extra launcher arguments.
        static_hosts: the -H/--hostfile hosts (used when there is no discovery script), or None
            for this machine with --max-np slots.
        cluster: a started SimulatedCluster to run on (host names host0, host1, ...), or None.
        skip_host_check: do not probe remote hosts over ssh before each start.
        verbose: print each launcher command.
    """

    def __init__(
        self,
        options: ElasticOptions,
        command: list,
        settings: dict,
        mpi_args: list,
        static_hosts: list | None = None,
        cluster=None,
        skip_host_check: bool = False,
        verbose: bool = False,
    ):
        self.options = options
        self.command = list(command)
        self.settings = dict(settings)
        self.mpi_args = list(mpi_args)
        self.cluster = cluster
        if cluster is not None:
            per_host = -(-options.max_np // len(cluster.hosts))
            static_hosts = [Host(h.name, per_host) for h in cluster.hosts]
        elif static_hosts is None:
            static_hosts = [Host("localhost", options.max_np)]
        self.static_hosts = static_hosts
        self.skip_host_check = skip_host_check or cluster is not None
        self.verbose = verbose
        self.job_id = os.environ.get("HOROVODLITE_ELASTIC_JOB_ID") or (
            f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        )
        elastic_dir = os.environ.get("HOROVODLITE_ELASTIC_DIR") or os.path.join(
            tempfile.gettempdir(), "horovodlite-elastic"
        )
        self.commit_folder = os.path.join(elastic_dir, self.job_id)
        self.streaks: dict = {}  # host name -> runs in a row whose workers failed there
        self.excluded: set = set()
        self.known_hosts: set = {h.name for h in static_hosts}
        self._child: subprocess.Popen | None = None
        self._stopped_by: int | None = None
        self._folder: str | None = None
        self.hosts_file: str | None = None
        self._counter = 0
        self._warned: set = set()
        self._mpiexec: str | None = None

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job to its end; return 0, or a non-zero status with the reason logged."""
        self._folder = tempfile.mkdtemp(prefix="horovodlite-elastic-")
        self.hosts_file = os.path.join(self._folder, "hosts")
        self._write_counter()
        previous = self._catch_signals()
        try:
            return self._loop()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            shutil.rmtree(self._folder, ignore_errors=True)

    def _loop(self) -> int:
        options = self.options
        hosts = self._wait_for_slots("start")
        np = min(options.np, sum(h.slots for h in hosts))
        placed = place(hosts, np)
        _log(
            f"job {self.job_id}: starting {np} workers on {_describe(placed)} (--min-np "
            f"{options.min_np}, --max-np {options.max_np}, up to {options.max_restarts} "
            f"restarts after failures); commits in {self.commit_folder}"
        )
        restart = failures = 0
        while True:
            outcome = self._attempt(np, placed, restart)
            if self._stopped_by is not None:
                _log(f"stopped by signal {self._stopped_by}: no restart")
                return outcome.status or 128 + self._stopped_by
            if outcome.status == 0:
                _log(f"job {self.job_id} finished after {restart} restart(s)")
                return 0
            if outcome.hosts_updated:
                reason = "hosts added"
                for name in {h.name for h in placed}:
                    self.streaks[name] = 0
            else:
                failures += 1
                reason = outcome.reason
                self._note_failures({h.name for h in placed}, outcome.failed_hosts)
                if failures > options.max_restarts:
                    _log(
                        f"giving up: the job failed {failures} times, more than --max-restarts "
                        f"{options.max_restarts} allows (last: {reason}); the last commit "
                        f"({self._commit_text()}) is kept in {self.commit_folder}"
                    )
                    return outcome.status or 1
            if options.restart_delay > 0:
                time.sleep(options.restart_delay)
            if self._stopped_by is not None:
                return outcome.status or 128 + self._stopped_by
            hosts = self._wait_for_slots(f"restart after: {reason}")
            np = min(options.max_np, sum(h.slots for h in hosts))
            placed = place(hosts, np)
            restart += 1
            counted = "not counted" if outcome.hosts_updated else (
                f"failure {failures} of {options.max_restarts} allowed"
            )  # fmt: skip
            _log(
                f"restart {restart} ({reason}; {counted}): {np} workers on {_describe(placed)}, "
                f"resuming from {self._commit_text()}"
            )

    def _commit_text(self) -> str:
        number = newest_commit(self.commit_folder)
        return "no commit yet" if number is None else f"commit {number}"

    def _note_failures(self, ran_on: set, failed: set) -> None:
        """Count runs in a row that failed on each host; exclude a host at FAILURES_TO_EXCLUDE.

        A failure that names no host changes nothing. The only host a job has is never
        excluded: a single-machine job retries there until --max-restarts.
        """
        if not failed:
            return
        for name in ran_on:
            self.streaks[name] = self.streaks.get(name, 0) + 1 if name in failed else 0
            if self.streaks[name] >= FAILURES_TO_EXCLUDE and len(self.known_hosts) > 1:
                if name not in self.excluded:
                    self.excluded.add(name)
                    _log(
                        f"host {name} excluded: its workers failed in {self.streaks[name]} runs "
                        f"in a row"
                    )

    # -- hosts --------------------------------------------------------------------------------

    def _usable_hosts(self) -> list:
        """Return the hosts that may run workers now (discovery or static, minus excluded)."""
        if self.options.discovery_script is not None:
            hosts = discover_hosts(self.options.discovery_script)
            if self.cluster is not None:
                names = [h.name for h in self.cluster.hosts]
                for host in hosts:
                    if host.name not in names:
                        raise DiscoveryError(
                            f"{self.options.discovery_script} names {host.name!r}, which is not "
                            f"one of the simulated hosts ({', '.join(names)})"
                        )
            else:
                hosts = launcher_hosts(hosts)
            self.known_hosts |= {h.name for h in hosts}
        else:
            hosts = self.static_hosts
        return [h for h in hosts if h.name not in self.excluded]

    def _reachable(self, hosts: list) -> list:
        if self.skip_host_check:
            return hosts
        remote = [h for h in hosts if not is_local(h.name)]
        if not remote:
            return hosts
        with ThreadPoolExecutor(max_workers=min(16, len(remote))) as pool:
            errors = dict(zip([h.name for h in remote],
                              pool.map(lambda h: ssh_probe(h.name, 10.0), remote)))  # fmt: skip
        for name, error in errors.items():
            if error:
                _log(f"host {name} left out of this run: ssh says {error}")
        return [h for h in hosts if not errors.get(h.name)]

    def _wait_for_slots(self, why: str) -> list:
        """Return the usable hosts once they offer --min-np slots; wait --elastic-timeout.

        Raises:
            DiscoveryError: the discovery script fails.
            NotEnoughSlots: --min-np slots did not come in time.
        """
        deadline = time.monotonic() + self.options.elastic_timeout
        waited = False
        while True:
            hosts = self._reachable(self._usable_hosts())
            total = sum(h.slots for h in hosts)
            if total >= self.options.min_np:
                return hosts
            if time.monotonic() >= deadline or self._stopped_by is not None:
                excluded = (
                    f"; excluded after failing {FAILURES_TO_EXCLUDE} runs in a row: "
                    f"{', '.join(sorted(self.excluded))}" if self.excluded else ""
                )  # fmt: skip
                raise NotEnoughSlots(
                    f"{why}: {total} slot(s) available ({_describe(hosts)}), fewer than --min-np "
                    f"{self.options.min_np}, after waiting {self.options.elastic_timeout:g} s "
                    f"(--elastic-timeout){excluded}; the last commit ({self._commit_text()}) is "
                    f"kept in {self.commit_folder}"
                )
            if not waited:
                _log(f"{why}: {total} slot(s) available, waiting for --min-np "
                     f"{self.options.min_np}")  # fmt: skip
                waited = True
            time.sleep(self.options.discovery_interval)

    # -- one run ------------------------------------------------------------------------------

    def _environment(self, restart: int) -> dict:
        env = dict(self.settings)
        env["HOROVODLITE_ELASTIC_JOB_ID"] = self.job_id
        env["HOROVODLITE_ELASTIC_HOSTS_FILE"] = self.hosts_file
        env["HOROVODLITE_ELASTIC_HOSTS_BASELINE"] = str(self._counter)  # what a bump changes
        env["HOROVODLITE_ELASTIC_RESTART"] = str(restart)
        if os.environ.get("HOROVODLITE_ELASTIC_DIR"):
            env["HOROVODLITE_ELASTIC_DIR"] = os.environ["HOROVODLITE_ELASTIC_DIR"]
        return env

    def _command(self, np: int, placed: list, settings: dict, local: dict) -> tuple:
        from .mpi_launcher import HYDRA, build_command, detect_flavour, find_mpiexec

        if self._mpiexec is None:
            self._mpiexec = find_mpiexec()
            self._flavour = detect_flavour(self._mpiexec)
        if self.cluster is None:
            argv = build_command(self._flavour, self._mpiexec, np, placed, self.command,
                                 settings, self.mpi_args)  # fmt: skip
            return argv, {**os.environ, **settings, **local}
        if self._flavour != HYDRA:
            raise LaunchError("the simulated cluster drives MPICH's Hydra launcher, not Open MPI")
        from .simcluster import NETWORK_ENV

        addresses = {h.name: h.address for h in self.cluster.hosts}
        hosts = ",".join(f"{addresses[h.name]}:{h.slots}" for h in placed)
        genv = [word for name, value in settings.items() for word in ("-genv", name, value)]
        argv = [self._mpiexec, "-launcher", "ssh", "-launcher-exec", self.cluster.launcher_script,
                "-localhost", self.cluster.bridge_address, "-hosts", hosts, "-n", str(np),
                *genv, *self.mpi_args, *self.command]  # fmt: skip
        return argv, {**os.environ, **NETWORK_ENV, **settings, **local}

    def _attempt(self, np: int, placed: list, restart: int) -> _Outcome:
        """Run the job once at `np` ranks; return how it ended, every rank gone."""
        settings = self._environment(restart)
        with ExitWatch() as watch:
            argv, env = self._command(np, placed, settings, watch.environment)
            if self.verbose:
                print(f"horovodlite-run: {shlex.join(argv)}", file=sys.stderr, flush=True)
            self._child = subprocess.Popen(argv, env=env, start_new_session=True)
            try:
                bumped = self._watch_run(np)
            except BaseException:
                self._stop(self._child)  # never leave a job running behind an error
                raise
            finally:
                status = self._child.wait()
                self._end_stragglers(watch.folder)
                self._child = None
            status = status if status >= 0 else 128 - status
            culprits = watch.culprits()
            message = watch.message()
        if status == 0:
            return _Outcome(0, False, "finished")
        if status == HOSTS_UPDATED_EXIT_CODE and bumped and not culprits:
            return _Outcome(status, True, "hosts added")
        if message:
            print(f"horovodlite-run: {message}", file=sys.stderr, flush=True)
        ranks = [rank for rank, _ in culprits]
        owners = rank_hosts(placed)
        failed = {owners[r] for r in ranks if r < len(owners)}
        # The watch may see the first death and the ranks mpiexec killed after it in one look:
        # blame a host only when every rank named is on it.
        failed = failed if len(failed) == 1 else set()
        if culprits:
            named = ", ".join(f"rank {r} on {owners[r]}" for r in ranks if r < len(owners))
            reason = f"{named} ended without leaving horovodlite, mpiexec status {status}"
        elif status == HOSTS_UPDATED_EXIT_CODE and not bumped:
            reason = (
                f"workers exited with status {HOSTS_UPDATED_EXIT_CODE} (hosts updated), but the "
                f"launcher had not announced new hosts"
            )
        else:
            reason = f"the job exited with status {status}"
        return _Outcome(status, False, reason, failed)

    def _watch_run(self, np: int) -> bool:
        """Wait for the running job, polling discovery; return whether new hosts were announced.

        New hosts are announced only once the run has made a commit: a run without a commit
        has nothing to restart from. (The workers compare the counter with the one this
        launcher gave them at the start, HOROVODLITE_ELASTIC_HOSTS_BASELINE.)
        """
        bumped = False
        interval = self.options.discovery_interval
        commits_at_start = _commit_numbers_seen(self.commit_folder)
        while True:
            try:
                self._child.wait(timeout=interval)
                return bumped
            except subprocess.TimeoutExpired:
                pass
            if bumped or self.options.discovery_script is None or np >= self.options.max_np:
                continue
            if _commit_numbers_seen(self.commit_folder) <= commits_at_start:
                continue  # no commit in this run yet
            try:
                hosts = self._usable_hosts()
            except ValueError as exc:  # a bad discovery run does not stop a healthy job
                if str(exc) not in self._warned:
                    self._warned.add(str(exc))
                    _log(f"warning: {exc} (the job goes on)")
                continue
            slots = sum(h.slots for h in hosts)
            if slots > np:
                self._counter += 1
                self._write_counter()
                bumped = True
                _log(
                    f"discovery shows {slots} usable slots ({_describe(hosts)}), the job uses "
                    f"{np}: hosts file set to {self._counter}, the workers restart at their next "
                    f"commit"
                )

    def _write_counter(self) -> None:
        part = self.hosts_file + ".part"
        with open(part, "w") as f:
            f.write(f"{self._counter}\n")
        os.replace(part, self.hosts_file)  # whole or the old one for the readers

    def _end_stragglers(self, folder: str) -> None:
        """Kill any rank of the run that outlived mpiexec (ranks run in their own sessions)."""
        host = socket.gethostname()
        try:
            names = [n for n in os.listdir(folder) if n.startswith("rank-") and "." not in n]
        except OSError:
            names = []
        for name in names:
            try:
                with open(os.path.join(folder, name)) as f:
                    pid_text, rank_host = f.read().split()
                pid = int(pid_text)
                if rank_host != host:
                    continue
                # The pid may have been reused: only a process carrying this run's folder in
                # its environment is one of its ranks.
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if folder.encode() not in f.read():
                        continue
                os.kill(pid, signal.SIGKILL)
                _log(f"{name.replace('-', ' ')} (pid {pid}) outlived mpiexec: killed")
            except (OSError, ValueError):
                continue
        if self.cluster is not None:
            from .netns import kill_namespace_processes

            for simulated in self.cluster.hosts:
                kill_namespace_processes(simulated.namespace)

    # -- signals ------------------------------------------------------------------------------

    def _catch_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _on_signal(self, signum, frame) -> None:
        self._stopped_by = signum
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)
            threading.Thread(target=self._kill_later, args=(child,), daemon=True).start()

    @staticmethod
    def _kill_later(child: subprocess.Popen) -> None:
        try:
            child.wait(timeout=_STOP_GRACE)
        except subprocess.TimeoutExpired:
            child.kill()

    @classmethod
    def _stop(cls, child: subprocess.Popen) -> None:
        """End mpiexec: SIGTERM (it ends the ranks), SIGKILL after _STOP_GRACE seconds."""
        if child.poll() is None:
            child.terminate()
            cls._kill_later(child)
