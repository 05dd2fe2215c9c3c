"""The elastic flags and host discovery: defaults, checks, the discovery script, placement.

A discovery script prints the hosts available now in Horovod's format, `hostname:slots` or
`hostname` a line; the launcher (elastic.py) runs it at each start and while the job runs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass

from .hosts import Host, _parse_entry

__all__ = [
    "DEFAULT_DISCOVERY_INTERVAL",
    "DEFAULT_ELASTIC_TIMEOUT",
    "DEFAULT_MAX_RESTARTS",
    "DEFAULT_RESTART_DELAY",
    "DISCOVERY_TIMEOUT",
    "DiscoveryError",
    "ElasticOptions",
    "check_options",
    "discover_hosts",
    "parse_discovery_output",
    "place",
    "rank_hosts",
]

# Horovod restarts without limit; torchrun not at all. A few restarts ride out lost hosts, and a
# job that crashes on its own every time stops after four runs instead of looping for ever.
DEFAULT_MAX_RESTARTS = 3
DEFAULT_RESTART_DELAY = 1.0  # seconds between the end of a failed run and the next start
DEFAULT_DISCOVERY_INTERVAL = 1.0  # Horovod's: the discovery script runs once a second
DEFAULT_ELASTIC_TIMEOUT = 600.0  # Horovod's: how long to wait for --min-np slots
DISCOVERY_TIMEOUT = 30.0  # one run of the discovery script


class DiscoveryError(ValueError):
    """The host discovery script is missing, not executable, fails, or prints bad lines."""


@dataclass(frozen=True)
class ElasticOptions:
    """The elastic flags of one horovodlite-run, checked by check_options()."""

    np: int
    min_np: int
    max_np: int
    max_restarts: int = DEFAULT_MAX_RESTARTS
    restart_delay: float = DEFAULT_RESTART_DELAY
    discovery_script: str | None = None
    discovery_interval: float = DEFAULT_DISCOVERY_INTERVAL
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT


def check_options(
    np: int | None,
    min_np: int | None,
    max_np: int | None,
    max_restarts: int | None = None,
    restart_delay: float | None = None,
    discovery_script: str | None = None,
    discovery_interval: float | None = None,
    elastic_timeout: float | None = None,
) -> ElasticOptions:
    """Fill in the defaults and check the elastic flags against each other.

    -np defaults to --min-np (else --max-np); --min-np to -np (or --max-np if lower), --max-np
    to -np (or --min-np if higher).

    Raises:
        ValueError: a bound below 1, --min-np above --max-np, -np outside them, a negative
            count or time, or a discovery script that cannot run.
    """
    given = [v for v in (np, min_np, max_np) if v is not None]
    if not given:
        raise ValueError("elastic runs need -np, --min-np or --max-np")
    np = np if np is not None else (min_np if min_np is not None else max_np)
    min_np = min_np if min_np is not None else min(np, max_np if max_np is not None else np)
    max_np = max_np if max_np is not None else max(np, min_np)
    for flag, value in (("-np", np), ("--min-np", min_np), ("--max-np", max_np)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    if min_np > max_np:
        raise ValueError(f"--min-np {min_np} is above --max-np {max_np}: swap them or fix one")
    if not min_np <= np <= max_np:
        raise ValueError(
            f"-np {np} is outside [--min-np {min_np}, --max-np {max_np}]: -np is the size the "
            f"job starts at"
        )
    max_restarts = DEFAULT_MAX_RESTARTS if max_restarts is None else max_restarts
    if max_restarts < 0:
        raise ValueError(f"--max-restarts must be 0 or more, got {max_restarts}")
    times = {
        "--restart-delay": (restart_delay, DEFAULT_RESTART_DELAY, 0.0),
        "--discovery-interval": (discovery_interval, DEFAULT_DISCOVERY_INTERVAL, 0.01),
        "--elastic-timeout": (elastic_timeout, DEFAULT_ELASTIC_TIMEOUT, 0.0),
    }
    checked = {}
    for flag, (value, default, least) in times.items():
        value = default if value is None else value
        if not (value >= least and value < float("inf")):
            raise ValueError(f"{flag} must be a finite number of seconds >= {least:g}, got {value}")
        checked[flag] = value
    if discovery_script is not None:
        discovery_script = _check_script(discovery_script)
    return ElasticOptions(
        np, min_np, max_np, max_restarts, checked["--restart-delay"], discovery_script,
        checked["--discovery-interval"], checked["--elastic-timeout"],
    )  # fmt: skip


def _check_script(path: str) -> str:
    if not path:
        raise DiscoveryError("--host-discovery-script is empty: give the path of an executable")
    if not os.path.exists(path):
        raise DiscoveryError(f"host discovery script {path} does not exist")
    if os.path.isdir(path):
        raise DiscoveryError(f"host discovery script {path} is a folder, not a program")
    if not os.access(path, os.X_OK):
        raise DiscoveryError(
            f"host discovery script {path} is not executable: chmod +x {shlex.quote(path)}"
        )
    return os.path.abspath(path)


def parse_discovery_output(text: str, script: str = "the discovery script") -> list:
    """Parse Horovod's discovery format, `hostname:slots` or `hostname` a line, into Hosts.

    Blank lines are skipped; a host without slots has one.

    Raises:
        DiscoveryError: a malformed line (named with its number and text), or a host twice.
    """
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.strip()
        if not entry:
            continue
        where = f"{script} printed {line!r} on line {number} (expected hostname:slots or hostname)"
        if re.search(r"\s", entry):
            raise DiscoveryError(f"{where}: no spaces in an entry")
        try:
            hosts.append(_parse_entry(entry, where))
        except ValueError as exc:
            raise DiscoveryError(str(exc)) from None
    names = [h.name for h in hosts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DiscoveryError(f"{script} lists {', '.join(twice)} more than once: one line a host")
    return hosts


def discover_hosts(script: str, timeout: float = DISCOVERY_TIMEOUT) -> list:
    """Run the discovery script and return the hosts it prints.

    Raises:
        DiscoveryError: it cannot run, runs past `timeout`, exits non-zero, or prints bad lines.
    """
    try:
        result = subprocess.run(
            [script], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"host discovery script {script} ran past {timeout:g} s") from None
    except OSError as exc:
        raise DiscoveryError(f"cannot run host discovery script {script}: {exc}") from None
    if result.returncode != 0:
        said = result.stderr.strip().splitlines()[-1:] or ["(nothing on stderr)"]
        raise DiscoveryError(
            f"host discovery script {script} failed with exit status {result.returncode}: {said[0]}"
        )
    return parse_discovery_output(result.stdout, script)


def place(hosts: list, np: int) -> list:
    """Return the hosts that run `np` ranks, filling each host's slots in order."""
    placed, left = [], np
    for host in hosts:
        if left <= 0:
            break
        take = min(host.slots, left)
        placed.append(Host(host.name, take))
        left -= take
    return placed


def rank_hosts(placed: list) -> list:
    """Return the host name of each rank, in rank order, for hosts from place()."""
    return [h.name for h in placed for _ in range(h.slots)]
