"""Which hosts a communicator spans, and the address at which other hosts reach this one.

Transports that open their own sockets (torch.distributed's Gloo: horovodlite's `gloo`) need
an address for each rank and for their rendezvous. On one host that is loopback; across hosts
it is the address of the network interface the user names (HOROVODLITE_GLOO_IFACE, Horovod's
HOROVOD_GLOO_IFACE, or torch's GLOO_SOCKET_IFNAME), else the address this host's name resolves
to. A host name that resolves to loopback (common: 127.0.1.1 in /etc/hosts) would make every
other rank wait for a connection that never comes, so `reachable_address` finds that before any
socket is opened, and the caller raises on every rank, naming the host and the fix.

"One host" is MPI's notion, the ranks that share memory (MPI_COMM_TYPE_SHARED), as everywhere
in horovodlite: several network namespaces with the same host name are several hosts.
"""

import fcntl
import ipaddress
import os
import socket
import struct

from mpi4py import MPI

__all__ = ["one_host", "cores_per_rank", "share_of_cores", "interface_address", "reachable_address"]

_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


def one_host(comm) -> bool:
    """Return whether all ranks of `comm` share one host's memory (collective on `comm`)."""
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    try:
        return shared.size == comm.size
    finally:
        shared.Free()


def cores_per_rank(local_comm) -> float:
    """Return the cores each rank of this host can have to itself (collective on `local_comm`,
    the ranks of one host): the cores any of them may run on, shared out among them.

    The union of the ranks' CPU affinities, not one rank's: ranks pinned one to a core each
    have a core each, and ranks that share a container's two cores have half a core each
    whatever the machine beneath holds.
    """
    if hasattr(os, "sched_getaffinity"):
        mine = sorted(os.sched_getaffinity(0))
    else:
        mine = list(range(os.cpu_count() or 1))
    return share_of_cores(local_comm.allgather(mine))


def share_of_cores(affinities: list) -> float:
    """Return the cores per rank for ranks that may run on `affinities` (one set of cores each)."""
    return len(set().union(*map(set, affinities))) / len(affinities)


def interface_address(name: str) -> str:
    """Return the IPv4 address of network interface `name` (Linux).

    Raises:
        OSError: there is no such interface, or it has no IPv4 address.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("256s", name[:15].encode())
        packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
    return socket.inet_ntoa(packed[20:24])


def reachable_address(interface: str = "") -> tuple:
    """Return (address, "") at which other hosts can reach this process, or (None, why not).

    `interface` names the network interface to use; "" means the address of the host's name.
    """
    if interface:
        try:
            return interface_address(interface), ""
        except OSError as exc:
            return None, f"network interface {interface!r} has no IPv4 address ({exc.strerror})"
    name = socket.getfqdn()
    try:
        address = socket.gethostbyname(name)
    except OSError as exc:
        return None, f"its host name {name!r} does not resolve ({exc})"
    if ipaddress.ip_address(address).is_loopback:
        return None, f"its host name {name!r} resolves to {address}, which other hosts cannot reach"
    return address, ""
