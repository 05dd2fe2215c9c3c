"""Host lists: parse `-H host1:2,host2:2` and hostfiles, check slots and reachability.

A host is a name or an address with a number of slots (processes it may run). `-H` takes
`name[:slots]` entries separated by commas (IPv6 addresses in brackets: `[fd00::1]:2`); a hostfile
has one host a line, as `name slots=N` (Open MPI) or `name:N` (MPICH), with `#` comments. A host
without a slot count has one slot.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

from .errors import LaunchError

__all__ = [
    "Host",
    "check_reachable",
    "check_slots",
    "checked_host",
    "default_hosts",
    "hosts_argument",
    "is_local",
    "launcher_hosts",
    "parse_hostfile",
    "parse_hosts",
    "ssh_probe",
]

# RFC 1123 host names: labels of letters, digits and inner hyphens (underscores tolerated).
_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                   r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$")  # fmt: skip


class Host(NamedTuple):
    """A host and the number of processes it may run."""

    name: str
    slots: int


def _check_name(name: str, where: str) -> str:
    if name.startswith("[") and name.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(name[1:-1]))
        except ValueError:
            raise ValueError(f"{where}: {name!r} is not an IPv6 address") from None
    try:
        return str(ipaddress.IPv4Address(name))
    except ValueError:
        pass
    if not _NAME.match(name):
        raise ValueError(
            f"{where}: {name!r} is not a host name or address "
            f"(letters, digits, '-', '.'; IPv6 in brackets, e.g. [fd00::1]:2)"
        )
    return name


# MPI launchers read slot counts into C ints (a larger count overflows and hangs Hydra); no host
# runs this many processes.
MAX_SLOTS = 65536


def _check_slots_value(text: str, where: str) -> int:
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise ValueError(f"{where}: slots must be a positive integer, got {text!r}")
    if int(text) > MAX_SLOTS:
        raise ValueError(f"{where}: slots must be at most {MAX_SLOTS}, got {text}")
    return int(text)


def _parse_entry(entry: str, where: str) -> Host:
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise ValueError(f"{where}: {entry!r} opens '[' without closing it")
        name, rest = entry[: close + 1], entry[close + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"{where}: expected ':slots' after {name}, got {rest!r}")
        slots = rest[1:] if rest else None
    elif ":" in entry:
        name, slots = entry.rsplit(":", 1)
    else:
        name, slots = entry, None
    if not name:
        raise ValueError(f"{where}: {entry!r} has no host name before ':'")
    return Host(_check_name(name, where), 1 if slots is None else _check_slots_value(slots, where))


def checked_host(name: str, slots: int, where: str) -> Host:
    """Return Host(name, slots) after checking the name and the slot count as -H does.

    Raises:
        ValueError: a bad name, or slots out of 1..MAX_SLOTS (named with `where`).
    """
    return Host(_check_name(name, where), _check_slots_value(str(slots), where))


def _no_duplicates(hosts: list, source: str) -> list:
    seen = set()
    for host in hosts:
        if host.name in seen:
            raise ValueError(
                f"{source}: host {host.name!r} is listed twice: list it once with all its slots"
            )
        seen.add(host.name)
    return hosts


def parse_hosts(text: str) -> list:
    """Parse `host1:2,host2:2` into a list of Host.

    Raises:
        ValueError: an empty list, an empty entry, a bad name, bad slots or a duplicate host.
    """
    if not text or not text.strip():
        raise ValueError("-H: the host list is empty: give e.g. -H host1:2,host2:2")
    hosts = []
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            raise ValueError(f"-H {text!r}: empty entry (stray ','); expected host1:2,host2:2")
        hosts.append(_parse_entry(entry, f"-H {text!r}"))
    return _no_duplicates(hosts, f"-H {text!r}")


def parse_hostfile(path: str) -> list:
    """Parse a hostfile (`name slots=N` or `name:N` lines, `#` comments) into a list of Host.

    Raises:
        ValueError: a malformed line (named with its line number), or no host at all.
        OSError: the file cannot be read.
    """
    hosts = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            where = f"{path}:{number}"
            host = _parse_entry(words[0], where)
            for word in words[1:]:
                key, _, value = word.partition("=")
                if key == "slots" and value:
                    host = Host(host.name, _check_slots_value(value, where))
                elif key in ("max_slots", "max-slots") and value:
                    _check_slots_value(value, where)  # a cap on oversubscription: not used
                else:
                    raise ValueError(
                        f"{where}: unexpected {word!r}: write 'host slots=N' or 'host:N'"
                    )
            hosts.append(host)
    if not hosts:
        raise ValueError(f"hostfile {path} lists no host")
    return _no_duplicates(hosts, f"hostfile {path}")


def hosts_argument(hosts: list) -> str:
    """Return `name:slots,...`, the host list both Hydra (-hosts) and Open MPI (-H) accept."""
    return ",".join(f"{h.name}:{h.slots}" for h in hosts)


def launcher_hosts(hosts: list) -> list:
    """Return `hosts` as the MPI launchers can take them: no IPv6 address in the list.

    Both launchers split `name:slots` at a colon, so Hydra would read `::1:2` as a host named
    '' and start ssh for it. An address of this machine becomes `localhost`; a remote IPv6
    address is refused with the fix.

    Raises:
        ValueError: a remote IPv6 address, or this machine listed twice.
    """
    result = []
    for host in hosts:
        if ":" in host.name:
            if not is_local(host.name):
                raise ValueError(
                    f"host {host.name!r}: MPI launchers cannot take IPv6 addresses in a host "
                    f"list: give the host's name instead (add it to /etc/hosts)"
                )
            host = Host("localhost", host.slots)
        result.append(host)
    return _no_duplicates(result, "the host list")


def check_slots(hosts: list, np: int) -> None:
    """Raise ValueError unless `np` processes fit in the hosts' slots."""
    if np < 1:
        raise ValueError(f"-np must be at least 1, got {np}")
    total = sum(h.slots for h in hosts)
    if np > total:
        raise ValueError(
            f"-np {np} needs {np} slots, but the hosts offer {total} ({hosts_argument(hosts)}): "
            f"lower -np or give the hosts more slots"
        )


def _addresses(name: str) -> list:
    bare = name[1:-1] if name.startswith("[") else name
    try:
        infos = socket.getaddrinfo(bare, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise LaunchError(
            f"cannot resolve host {name!r} ({exc.strerror}): check the host list, DNS or /etc/hosts"
        ) from None
    return [(family, address[0]) for family, _, _, _, address in infos]


def is_local(name: str) -> bool:
    """Return whether `name` is this machine: an address of it can be bound (sends nothing)."""
    if name in ("localhost", socket.gethostname()):
        return True
    for family, address in _addresses(name):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, 0))
                return True
            except OSError:
                continue
    return False


def ssh_probe(name: str, timeout: float) -> str | None:
    """Run `true` on `name` over ssh as the launcher will; return the error text, or None."""
    ssh = shutil.which("ssh")
    if ssh is None:
        return "no ssh client found (install openssh-client); remote ranks are started over ssh"
    bare = name[1:-1] if name.startswith("[") else name
    argv = [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(timeout))}",
            bare, "true"]  # fmt: skip
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout + 5, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return f"ssh did not answer within {timeout + 5:.0f} s"
    if result.returncode != 0:
        return result.stderr.strip() or f"ssh exited with status {result.returncode}"
    return None


def check_reachable(
    hosts: list, timeout: float = 10.0, probe: Callable[[str, float], str | None] = ssh_probe
) -> None:
    """Raise LaunchError naming every remote host that cannot be resolved or reached.

    Local hosts are not probed. Remote ones are probed in parallel with `probe` (default: ssh,
    which MPICH's Hydra and Open MPI use to start their daemons).
    """
    remote = [h.name for h in hosts if not is_local(h.name)]
    if not remote:
        return
    with ThreadPoolExecutor(max_workers=min(16, len(remote))) as pool:
        errors = list(pool.map(lambda name: probe(name, timeout), remote))
    failed = [f"  {name}: {error}" for name, error in zip(remote, errors) if error]
    if failed:
        raise LaunchError(
            "unreachable host(s):\n" + "\n".join(failed) + "\nthe launcher starts remote "
            "processes over ssh: set up passwordless ssh (ssh HOST true must work), fix the host "
            "list, or pass --skip-host-check if your MPI starts them another way"
        )


def default_hosts(np: int) -> list:
    """Return the host list of a single-machine job: localhost with `np` slots."""
    return [Host("localhost", max(np, 1))]
