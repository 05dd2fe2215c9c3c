"""Network-namespace plumbing for the simulated cluster (simcluster.py).

The ip and tc tools, the names of what a cluster creates (`hvl<pid in hex>_<n>...`), removing
namespaces, links and folders (a cluster's own, or those left by dead processes), choosing a free
private subnet, and parsing link rates and delays.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import tempfile

from ..waiting import process_alive
from .errors import LaunchError

__all__ = [
    "PREFIX",
    "choose_subnet",
    "cleanup_stale",
    "ip",
    "kill_namespace_processes",
    "list_links",
    "list_namespaces",
    "parse_delay",
    "parse_rate",
    "remove",
    "tc",
    "tool",
    "unavailable_reason",
]

PREFIX = "hvl"
_POOL = ipaddress.IPv4Network("10.213.0.0/16")
_TAG = re.compile(rf"^{PREFIX}([0-9a-f]+)_([0-9a-f]+)")


def parse_rate(rate) -> int | None:
    """Return a link rate in bits per second from "100mbit", "1gbit", "1.5Gbit/s" or a number.

    Raises:
        ValueError: not a positive rate.
    """
    if rate is None:
        return None
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        bits = float(rate)
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt]?)bit(?:/s)?)?\s*",
                             str(rate), re.IGNORECASE)  # fmt: skip
        if match is None:
            raise ValueError(
                f"rate {rate!r} is not a link rate: write e.g. '100mbit', '1gbit' or a number of "
                f"bits per second (tc's 'mbps' would mean megabytes)"
            )
        scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[(match.group(2) or "").lower()]
        bits = float(match.group(1)) * scale
    if not bits >= 8000:
        raise ValueError(f"rate {rate!r} is below 8 kbit/s, which tc cannot shape")
    return int(bits)


def parse_delay(delay) -> int | None:
    """Return a one-way delay in microseconds from "0.1ms", "100us", "1s" or seconds.

    Raises:
        ValueError: not a non-negative delay.
    """
    if delay is None:
        return None
    if isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(s|ms|us)\s*", str(delay))
        if match is None:
            raise ValueError(f"delay {delay!r} is not a time: write e.g. '0.1ms' or '100us'")
        seconds = float(match.group(1)) * {"s": 1, "ms": 1e-3, "us": 1e-6}[match.group(2)]
    if not seconds >= 0:
        raise ValueError(f"delay {delay!r} must not be negative")
    return round(seconds * 1e6)


def tool(name: str) -> str | None:
    """Return the path of the system tool `name` (also in /usr/sbin, /sbin), or None."""
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.access(p, os.X_OK)), None
    )


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `ip ARGS`; raise LaunchError if it fails and `check`."""
    executable = tool("ip")
    if executable is None:
        raise LaunchError("the simulated cluster needs the ip tool: apt-get install iproute2")
    result = subprocess.run([executable, *args], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise LaunchError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def tc(*args: str, namespace: str | None = None) -> None:
    """Run `tc ARGS` (in `namespace`, if given); raise LaunchError if it fails."""
    executable = tool("tc")
    if executable is None:
        raise LaunchError("link rate and delay need the tc tool: apt-get install iproute2")
    argv = [executable, *args] if namespace is None else [executable, "-netns", namespace, *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        error = result.stderr.strip()
        hint = ""
        if "netem" in args and "unknown" in error.lower():
            hint = (
                ": this kernel has no netem queueing discipline (CONFIG_NET_SCH_NETEM, "
                "modprobe sch_netem), so links cannot be delayed here; leave delay out"
            )
        raise LaunchError(f"tc {' '.join(args)} failed: {error}{hint}")


def unavailable_reason() -> str | None:
    """Return why no simulated cluster can be built here, or None.

    Checks for root and the ip and tc tools, then creates and removes a namespace and a bridge.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the simulated cluster needs root (network namespaces, veths, tc)"
    for name in ("ip", "tc"):
        if tool(name) is None:
            return f"the simulated cluster needs the {name} tool: apt-get install iproute2"
    # Named like a cluster's, so that cleanup_stale() removes them if this process dies here.
    probe = f"{PREFIX}{os.getpid():x}_0p"
    for create, delete, what in (
        (("netns", "add", probe), ("netns", "delete", probe), "a network namespace"),
        (("link", "add", probe, "type", "bridge"), ("link", "delete", probe), "a bridge"),
    ):
        result = ip(*create, check=False)
        if result.returncode != 0:
            return f"cannot create {what} here (ip {' '.join(create)}: {result.stderr.strip()})"
        ip(*delete, check=False)
    return None


def list_namespaces() -> list:
    result = ip("netns", "list", check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def list_links() -> list:
    result = ip("-o", "link", "show", check=False)
    names = []
    for line in result.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def kill_namespace_processes(namespace: str) -> None:
    # Processes left in one of our namespaces are ranks or proxies this cluster started.
    result = ip("netns", "pids", namespace, check=False)
    for pid in result.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def remove(namespaces: list, links: list, directories: list) -> list:
    """Remove namespaces (killing what runs in them), links and directories; return errors."""
    errors = []
    for namespace in namespaces:
        kill_namespace_processes(namespace)
    # Links first: deleting a root-side veth takes its peer along at once, whereas a deleted
    # namespace releases its interfaces only later, asynchronously.
    present = set(list_links())
    for link in links:
        if link in present:
            result = ip("link", "delete", link, check=False)
            if result.returncode != 0 and link in list_links():
                errors.append(f"ip link delete {link}: {result.stderr.strip()}")
    for namespace in namespaces:
        result = ip("netns", "delete", namespace, check=False)
        if result.returncode != 0 and namespace in list_namespaces():
            errors.append(f"ip netns delete {namespace}: {result.stderr.strip()}")
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)
    return errors


def cleanup_stale() -> list:
    """Remove namespaces, links and script folders left by dead processes; return their names."""

    def dead(name: str) -> bool:
        match = _TAG.match(name)
        return match is not None and not process_alive(int(match.group(1), 16))

    namespaces = [n for n in list_namespaces() if dead(n)]
    links = [n for n in list_links() if dead(n)]
    tmp = tempfile.gettempdir()
    directories = [os.path.join(tmp, n) for n in os.listdir(tmp) if dead(n)]
    remove(namespaces, links, directories)
    return namespaces + links + directories


def _used_networks() -> list:
    used = []
    for args in (("-4", "-o", "addr", "show"), ("-4", "route", "show", "table", "all")):
        for line in ip(*args, check=False).stdout.splitlines():
            for word in line.split():
                if "/" in word or re.fullmatch(r"[0-9]+(\.[0-9]+){3}", word):
                    try:
                        used.append(ipaddress.IPv4Network(word, strict=False))
                    except ValueError:
                        pass
    return used


def choose_subnet(requested) -> ipaddress.IPv4Network:
    used = _used_networks()
    if requested is not None:
        overlap = [str(n) for n in used if n.overlaps(requested)]
        if overlap:
            raise LaunchError(
                f"subnet {requested} overlaps networks already in use here ({', '.join(overlap)}):"
                f" pick another private subnet or leave subnet unset"
            )
        return requested
    for candidate in _POOL.subnets(new_prefix=24):
        if not any(n.overlaps(candidate) for n in used):
            return candidate
    raise LaunchError(f"no free /24 left in {_POOL} for a simulated cluster: pass subnet=")
