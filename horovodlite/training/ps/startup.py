"""Before training: the job's communicator, who serves and who works, and the agreed checks.

`open_job` takes what the servers need from the initialized job: a communicator of their own (a
point_to_point.Channel's) and the settings. Each rank checks what it can alone, then one
allgather on that communicator shares every rank's error and facts, so a mistake found on one
rank (an unknown optimizer, parameters that differ) raises the same exception on every rank
before any training message.
"""

import socket
from typing import NamedTuple, Optional

from mpi4py.util import pkl5

from horovodlite.exceptions import HorovodLiteError
from horovodlite.state import current

from ..point_to_point import Channel

__all__ = ["Job", "open_job", "roles", "check_settings", "agree", "check_same_parameters",
           "host_facts"]  # fmt: skip

_KINDS = {"TypeError": TypeError, "ValueError": ValueError}


class Job(NamedTuple):
    """What the parameter servers take from the initialized job."""

    comm: pkl5.Intracomm  # the servers' and workers' own communicator (all of the job's ranks)
    timeout: float  # HOROVODLITE_COLLECTIVE_TIMEOUT: how long a worker waits for a server
    elastic_dir: Optional[str]  # under horovodlite-run's elastic mode: its folder and job id
    elastic_job_id: Optional[str]


def open_job() -> Job:
    """Return the job's facts and a private communicator of its ranks; every rank calls it."""
    channel = Channel()  # a duplicate of the job's communicator: no other message matches
    settings = current().settings
    return Job(pkl5.Intracomm(channel.comm), channel.timeout, settings.elastic_dir,
               settings.elastic_job_id)  # fmt: skip


def roles(size: int, servers: int) -> tuple:
    """Return (server ranks, worker ranks): the last `servers` ranks serve, so rank 0 works."""
    return list(range(size - servers, size)), list(range(size - servers))


def check_settings(size: int, servers, staleness) -> None:
    """Raise TypeError or ValueError on a server count or staleness that cannot run."""
    if isinstance(servers, bool) or not isinstance(servers, int):
        raise TypeError(f"servers must be an int, got {type(servers).__name__}")
    if staleness is not None and (isinstance(staleness, bool) or not isinstance(staleness, int)):
        raise TypeError(f"staleness must be None or an int, got {type(staleness).__name__}")
    if staleness is not None and staleness < 0:
        raise ValueError(f"staleness must be None (asynchronous) or >= 0, got {staleness}")
    if servers < 1 or servers >= size:
        raise ValueError(
            f"servers={servers} at {size} ranks leaves {size - servers} workers: "
            f"use 1 <= servers <= {size - 1} (every job needs at least one server and one worker)"
        )


def host_facts(pid: int) -> tuple:
    return socket.gethostname(), pid


def agree(comm, error: Optional[BaseException], facts) -> list:
    """Share every rank's `error` and `facts`; raise the lowest failing rank's error everywhere.

    Returns:
        every rank's facts, in rank order.
    """
    described = None if error is None else (type(error).__name__, str(error))
    shared = comm.allgather((described, facts))
    for rank, (failed, _) in enumerate(shared):
        if failed is not None:
            kind, message = failed
            raise _KINDS.get(kind, HorovodLiteError)(f"rank {rank}: {message}")
    return [f for _, f in shared]


def check_same_parameters(digests: list, names: list) -> None:
    """Raise ValueError if any rank's parameter digests differ from rank 0's.

    Args:
        digests: per rank, one digest per parameter.
        names: the parameters' names.
    """
    if any(len(d) != len(digests[0]) for d in digests):
        counts = {r: len(d) for r, d in enumerate(digests)}
        raise ValueError(f"the model has a different number of parameters on the ranks: {counts}")
    for i, name in enumerate(names):
        differ = [r for r, d in enumerate(digests) if d[i] != digests[0][i]]
        if differ:
            raise ValueError(
                f"parameter '{name}' differs between ranks at start (ranks {differ} differ from "
                "rank 0): seed every rank alike (torch.manual_seed) or load the same checkpoint "
                "before starting the parameter servers"
            )
