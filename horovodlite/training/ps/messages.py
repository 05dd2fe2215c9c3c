"""One Python object from one rank to another, received so that a sender's death is noticed.

An object travels as several MPI messages with one tag: an int64 array of the parts' sizes,
then the pickle (protocol 5), then each numpy array the pickle holds out of band (not copied
into it). mpi4py.util.pkl5 sends the same parts, but once it has matched the first it probes
and receives the others with blocking calls. A sender that dies between two parts then leaves
the receiver waiting forever, and one that dies while a large array is copied (MPICH reads it
from the sender's memory) ends the receive with a bare MPI error. Here each part is received
with nonblocking calls under waits.wait_for, whose `check` (the caller's) tells a dead peer from
a slow one and raises the error that says what was lost.
"""

import pickle
from typing import Callable, Optional

import numpy as np
from mpi4py import MPI

from horovodlite.exceptions import HorovodLiteError

from .waits import wait_for

__all__ = ["post", "arrived", "Outgoing", "Incoming"]


class Outgoing:
    """The sends of one object; its buffers live until they are complete."""

    def __init__(self, requests: list, parts: list):
        self._requests, self._parts = requests, parts

    def test(self) -> bool:
        """Whether every part has been sent (MPI.Exception where MPI failed one)."""
        return MPI.Request.Testall(self._requests)


def post(comm: MPI.Comm, obj, dest: int, tag: int) -> Outgoing:
    """Start sending `obj` to rank `dest`; the arrays in it must not change until it is sent."""
    buffers: list = []
    parts = [pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)]
    parts += [b.raw() for b in buffers]
    sizes = np.array([memoryview(part).nbytes for part in parts], np.int64)
    requests = [MPI.Comm.Isend(comm, [sizes, MPI.INT64_T], dest, tag)]
    requests += [MPI.Comm.Isend(comm, [part, MPI.BYTE], dest, tag) for part in parts]
    return Outgoing(requests, [sizes, *parts])


class Incoming:
    """An object whose first part (its sizes) has been matched; `receive` takes the rest."""

    def __init__(self, comm: MPI.Comm, message: MPI.Message, status: MPI.Status):
        self.comm, self.source, self.tag = comm, status.Get_source(), status.Get_tag()
        self._sizes = np.empty(status.Get_count(MPI.INT64_T), np.int64)
        self._first = message.Irecv([self._sizes, MPI.INT64_T])

    def receive(self, check: Callable[[], None]):
        """Receive the whole object and return it; `check` runs during long waits (see wait_for).

        The parts follow the sizes in order with the same tag, and MPI keeps the order of
        messages between two ranks, so receives posted now match them.
        """
        self._wait([self._first], check)
        parts = [np.empty(size, np.uint8) for size in self._sizes]
        self._wait([MPI.Comm.Irecv(self.comm, [part, MPI.BYTE], self.source, self.tag)
                    for part in parts], check)  # fmt: skip
        return pickle.loads(parts[0], buffers=parts[1:])

    def _wait(self, requests: list, check: Callable[[], None]) -> None:
        def done():
            try:
                return True if MPI.Request.Testall(requests) else None
            except MPI.Exception as e:
                check()  # a sender that died mid-message: the caller's own error
                raise HorovodLiteError(
                    f"rank {self.comm.rank}: receiving a message (tag {self.tag}) from rank "
                    f"{self.source} failed in MPI: {e}"
                ) from e

        wait_for(done, check)


def arrived(comm: MPI.Comm, source: int, tag: int) -> Optional[Incoming]:
    """Return the next object from `source` with `tag` (either may be MPI.ANY_*) that has
    started to arrive, or None."""
    status = MPI.Status()
    message = MPI.Comm.Improbe(comm, source, tag, status)
    return None if message is None else Incoming(comm, message, status)
