"""A simulated cluster: K "hosts" on this machine as network namespaces joined by a bridge.

Each host is a Linux network namespace with one interface, `eth0` (a veth pair whose other end
is on a bridge in the root namespace), and its own address in a private subnet that the cluster
owns. Links can be capped with `tc`: every host's uplink and downlink get `rate` (a token
bucket) and, where the kernel has netem, one-way `delay`. MPICH's Hydra starts one proxy per
host inside its namespace: `mpiexec -launcher ssh -launcher-exec SCRIPT -localhost BRIDGE
-hosts ADDR:SLOTS,...`, where SCRIPT stands in for ssh and runs its command in the namespace of
the address it is given. Ranks on one host share memory (MPI_COMM_TYPE_SHARED groups them by
host); traffic between hosts goes over the bridge because UCX is limited to TCP on eth0
(UCX_TLS=tcp,self, UCX_NET_DEVICES=eth0; without that UCX would find shared memory across the
namespaces). Hosts have no default route: they reach only each other and the bridge address.
All hosts share this machine's host name and file system.

Needs root, the `ip` and `tc` tools (iproute2) and MPICH's Hydra launcher. Everything created
(namespaces, veths, bridge, the launcher script) is named `hvl<pid in hex>_<n>...` and removed
on exit, on exceptions, on Ctrl-C and on SIGTERM; leftovers of dead processes with that prefix
are removed whenever a cluster starts.

API::

    from horovodlite.run.simcluster import SimulatedCluster, unavailable_reason

    with SimulatedCluster(hosts=2, rate="100mbit", delay=None) as cluster:
        argv, env = cluster.mpiexec(4, ["python", "train.py"], slots_per_host=2, env={...})
        subprocess.run(argv, env=env)                       # or, with a hard timeout:
        result = cluster.run(4, ["python", "train.py"], slots_per_host=2, timeout=120)
        result.returncode, result.stdout                    # stdout and stderr together
        cluster.hosts                                       # [SimulatedHost(name, namespace,
                                                            #   address, veth), ...]
        cluster.exec_argv(0, ["python", "server.py"])       # run a command on one host
        cluster.rate_bits, cluster.burst_bytes              # the cap, for bandwidth bounds

`SimulatedCluster(hosts, rate=None, delay=None, subnet=None)`: `rate` like "100mbit", "1gbit",
"500kbit" or bits per second; `delay` like "0.1ms", "100us" (needs sch_netem); `subnet` a
private IPv4 network such as "10.213.5.0/24" (default: the first free /24 in 10.213.0.0/16).
`unavailable_reason()` returns why no cluster can be built here (it tries), or None.

From the command line: `horovodlite-run -np 4 --simulated-hosts 2[:RATE[:DELAY]] python
train.py` builds a cluster of 2 hosts with 2 slots each, runs the job and removes the cluster.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import math
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from typing import NamedTuple

from .errors import LaunchError
from .mpi_launcher import HYDRA, detect_flavour, find_mpiexec
from .netns import (
    PREFIX,
    choose_subnet,
    cleanup_stale,
    ip,
    kill_namespace_processes,
    parse_delay,
    parse_rate,
    remove,
    tc,
    tool,
    unavailable_reason,
)

__all__ = [
    "NETWORK_ENV",
    "PREFIX",
    "SimulatedCluster",
    "SimulatedHost",
    "cleanup_stale",
    "parse_delay",
    "parse_rate",
    "unavailable_reason",
]

_MAX_HOSTS = 200
_LOCK_PATH = os.path.join(tempfile.gettempdir(), "horovodlite-simcluster.lock")
_counter = itertools.count()

# Environment that makes MPI (and Gloo) use the simulated network between hosts.
NETWORK_ENV = {
    "UCX_TLS": "tcp,self",
    "UCX_NET_DEVICES": "eth0",
    "GLOO_SOCKET_IFNAME": "eth0",
    "NCCL_SOCKET_IFNAME": "eth0",
}

_LAUNCHER_SCRIPT = """#!/bin/sh
# Stands in for ssh for MPICH's Hydra: called as `SCRIPT [ssh options] HOST COMMAND...`, it runs
# COMMAND, a remote-shell string as ssh would hand it to the remote shell, in HOST's namespace.
while [ $# -gt 0 ] && [ "${{1#-}}" != "$1" ]; do shift; done
host="$1"; shift
case "$host" in
{cases}
  *) echo "simulated cluster: $host is not one of its hosts ({addresses})" >&2; exit 255 ;;
esac
exec {ip} netns exec "$ns" /bin/sh -c "$*"
"""


class SimulatedHost(NamedTuple):
    """One simulated host: its name, network namespace, address, and root-side veth."""

    name: str
    namespace: str
    address: str
    veth: str


class SimulatedCluster:
    """K simulated hosts on this machine; a context manager that always removes them.

    Args:
        hosts: number of hosts (namespaces), 1 to 200.
        rate: cap on every host's uplink and downlink ("100mbit", "1gbit", bits/s), or None.
        delay: one-way delay added to every host's links ("0.1ms"; needs sch_netem), or None.
        subnet: a private IPv4 network for the bridge and the hosts, or None to pick a free /24
            in 10.213.0.0/16.

    Raises:
        ValueError: a bad argument (before anything is created).
    """

    def __init__(self, hosts: int, rate=None, delay=None, subnet=None):
        if not isinstance(hosts, int) or isinstance(hosts, bool) or not 1 <= hosts <= _MAX_HOSTS:
            raise ValueError(f"hosts must be an integer from 1 to {_MAX_HOSTS}, got {hosts!r}")
        self.rate_bits = parse_rate(rate)
        self.delay_us = parse_delay(delay)
        if subnet is not None:
            try:
                subnet = ipaddress.IPv4Network(subnet)
            except ValueError as exc:
                raise ValueError(f"subnet {subnet!r} is not an IPv4 network: {exc}") from None
            if not subnet.is_private or subnet.is_loopback or subnet.is_link_local:
                raise ValueError(f"subnet {subnet} is not private: use e.g. 10.213.5.0/24")
            if subnet.num_addresses - 2 < hosts + 1:
                raise ValueError(f"subnet {subnet} has no room for a bridge and {hosts} hosts")
        self.requested_subnet = subnet
        self.num_hosts = hosts
        # A token bucket lets `burst` bytes through at once: one millisecond at the rate, and
        # at least 32 KiB so that full-size segments pass.
        self.burst_bytes = (
            None if self.rate_bits is None else max(self.rate_bits // 8000, 32 * 1024)
        )
        self.tag = f"{PREFIX}{os.getpid():x}_{next(_counter) % 256:x}"
        self.bridge = f"{self.tag}b"
        self.subnet = self.bridge_address = None
        self.hosts: list = []
        self.script_dir = self.launcher_script = None
        self._created_namespaces: list = []
        self._created_links: list = []
        self._free_addresses = iter(())
        self._previous_sigterm = None
        self._started = False

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> SimulatedCluster:
        self.start()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            self.close()
        except LaunchError as error:
            if exc is None:
                raise
            print(f"horovodlite: {error}", file=sys.stderr)  # keep the job's own error

    def start(self) -> None:
        """Create the bridge, the hosts and the launcher script (removing all on failure).

        Raises:
            LaunchError: not root, no ip/tc, or a setup command failed.
        """
        if self._started:
            raise LaunchError(f"simulated cluster {self.tag} is already started")
        reason = unavailable_reason()
        if reason is not None:
            raise LaunchError(reason)
        self._started = True
        self.hosts, self.script_dir, self.launcher_script = [], None, None
        self._catch_sigterm()
        try:
            with open(_LOCK_PATH, "a") as lock:
                # Choosing a subnet and claiming it must not interleave with another cluster's.
                fcntl.flock(lock, fcntl.LOCK_EX)
                cleanup_stale()
                self.subnet = choose_subnet(self.requested_subnet)
                self._create_bridge()
            for index in range(self.num_hosts):
                self._create_host(index)
            self._write_launcher_script()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Remove everything this cluster created; safe to call twice.

        Raises:
            LaunchError: something could not be removed (named, with the command to retry).
        """
        if not self._started:
            return
        self._started = False
        errors = remove(
            self._created_namespaces,
            self._created_links,
            [self.script_dir] if self.script_dir else [],
        )
        self._created_namespaces, self._created_links = [], []
        self._restore_sigterm()
        if errors:
            raise LaunchError("could not remove the simulated cluster:\n" + "\n".join(errors))

    def _catch_sigterm(self) -> None:
        # SIGTERM would kill Python without unwinding; make it raise so __exit__ cleans up.
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

            def terminate(signum, frame):
                raise SystemExit(128 + signum)

            self._previous_sigterm = signal.signal(signal.SIGTERM, terminate)

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def _create_bridge(self) -> None:
        addresses = self.subnet.hosts()
        self.bridge_address = str(next(addresses))
        self._created_links.append(self.bridge)
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.bridge_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        self._free_addresses = addresses

    def _create_host(self, index: int) -> None:
        host = SimulatedHost(
            name=f"host{index}",
            namespace=f"{self.tag}h{index}",
            address=str(next(self._free_addresses)),
            veth=f"{self.tag}v{index:x}",
        )
        self._created_namespaces.append(host.namespace)
        ip("netns", "add", host.namespace)
        self._created_links.append(host.veth)
        ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns",
            host.namespace)  # fmt: skip
        ip("link", "set", host.veth, "master", self.bridge, "up")
        ns = ("-n", host.namespace)
        ip(*ns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip(*ns, "link", "set", "eth0", "up")
        ip(*ns, "link", "set", "lo", "up")
        # Shape both directions: eth0 inside is the host's uplink, the root-side veth its downlink.
        self._shape(host.veth, None)
        self._shape("eth0", host.namespace)
        self.hosts.append(host)

    def _shape(self, device: str, namespace: str | None) -> None:
        if self.delay_us:
            args = ["qdisc", "add", "dev", device, "root", "netem", "delay", f"{self.delay_us}us"]
            if self.rate_bits:
                args += ["rate", f"{self.rate_bits}bit"]
            tc(*args, "limit", "10000", namespace=namespace)
        elif self.rate_bits:
            args = ["qdisc", "add", "dev", device, "root", "tbf", "rate", f"{self.rate_bits}bit"]
            tc(*args, "burst", str(self.burst_bytes), "latency", "100ms", namespace=namespace)

    def _write_launcher_script(self) -> None:
        self.script_dir = tempfile.mkdtemp(prefix=f"{self.tag}-")
        cases = "\n".join(f"  {h.address}) ns={h.namespace} ;;" for h in self.hosts)
        addresses = ", ".join(h.address for h in self.hosts)
        path = os.path.join(self.script_dir, "netns-launcher")
        with open(path, "w") as f:
            f.write(_LAUNCHER_SCRIPT.format(cases=cases, addresses=addresses, ip=tool("ip")))
        os.chmod(path, stat.S_IRWXU)
        self.launcher_script = path

    # -- running --------------------------------------------------------------------------------

    def _require_started(self) -> None:
        if not self._started or not self.hosts:
            raise LaunchError("the simulated cluster is not running: use it in a with block")

    def exec_argv(self, host: int, command: list) -> list:
        """Return the argv that runs `command` (an argv list) on host number `host`."""
        self._require_started()
        return [tool("ip"), "netns", "exec", self.hosts[host].namespace, *command]

    def mpiexec(
        self,
        np: int,
        command: list,
        slots_per_host: int | None = None,
        env: dict | None = None,
        mpi_args: list | None = None,
        mpiexec: str | None = None,
    ) -> tuple:
        """Return (argv, env) that run `command` on `np` ranks, `slots_per_host` per host.

        Ranks fill host0's slots first, then host1's, and so on. `env` is added to this
        process's environment and to NETWORK_ENV (and wins over both).

        Raises:
            ValueError: np < 1, or more ranks than slots.
            LaunchError: the cluster is not running, or mpiexec is not MPICH's Hydra.
        """
        self._require_started()
        if slots_per_host is None:
            slots_per_host = math.ceil(np / len(self.hosts))
        if slots_per_host < 1 or np < 1 or np > slots_per_host * len(self.hosts):
            raise ValueError(
                f"cannot place {np} ranks on {len(self.hosts)} simulated hosts with "
                f"{slots_per_host} slots each: need 1 <= np <= hosts * slots_per_host"
            )
        if not command:
            raise ValueError("no command to run")
        mpiexec = mpiexec or find_mpiexec()
        if detect_flavour(mpiexec) != HYDRA:
            raise LaunchError(
                f"the simulated cluster drives MPICH's Hydra launcher, but {mpiexec} is Open MPI:"
                f" pip install mpich, or set HOROVODLITE_MPIEXEC to a Hydra mpiexec"
            )
        hosts = ",".join(f"{h.address}:{slots_per_host}" for h in self.hosts)
        argv = [mpiexec, "-launcher", "ssh", "-launcher-exec", self.launcher_script,
                "-localhost", self.bridge_address, "-hosts", hosts, "-n", str(np),
                *(mpi_args or []), *command]  # fmt: skip
        return argv, {**os.environ, **NETWORK_ENV, **(env or {})}

    def run(
        self,
        np: int,
        command: list,
        slots_per_host: int | None = None,
        timeout: float = 120,
        env: dict | None = None,
    ) -> subprocess.CompletedProcess:
        """Run `command` on `np` ranks; return it with stdout and stderr together as text.

        A job still running after `timeout` seconds is killed (its process group and whatever
        runs in the namespaces) and returned with returncode -9.
        """
        argv, full_env = self.mpiexec(np, command, slots_per_host, env)
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=timeout)
        except BaseException as exc:
            os.killpg(proc.pid, signal.SIGKILL)
            for host in self.hosts:
                kill_namespace_processes(host.namespace)
            out, _ = proc.communicate()
            if not isinstance(exc, subprocess.TimeoutExpired):
                raise
            out += f"\n*** killed after {timeout} s: the job hung ***"
            return subprocess.CompletedProcess(argv, -9, out)
        return subprocess.CompletedProcess(argv, proc.returncode, out)

    def describe(self) -> str:
        """Return a few lines naming the hosts, their addresses and the links."""
        link = "uncapped links"
        if self.rate_bits or self.delay_us:
            parts = []
            if self.rate_bits:
                parts.append(f"{self.rate_bits / 1e6:g} Mbit/s")
            if self.delay_us:
                parts.append(f"{self.delay_us / 1000:g} ms one-way delay")
            link = ", ".join(parts)
        lines = [f"simulated cluster {self.tag}: bridge {self.bridge} {self.bridge_address}, "
                 f"subnet {self.subnet}, {link}"]  # fmt: skip
        lines += [f"  {h.name}: {h.address} (netns {h.namespace})" for h in self.hosts]
        return "\n".join(lines)
