"""Point-to-point messages between the ranks of a process set, waited for as collectives are.

This module owns what a training feature needs to move data between two ranks, framework free:
a `Channel` on a private duplicate of a process set's communicator, so its messages never match a
collective's or the user's own; non-blocking sends and receives of host buffers (a numpy array of
any dtype, bytes, bytearray: anything with the buffer protocol), which travel as raw bytes; and
every wait through the job's Watch (horovodlite/waiting.py), as a collective's: no busy core,
HOROVODLITE_COLLECTIVE_TIMEOUT, and a member of the channel that shut down or exited turns the
wait into a HorovodLiteError that names it. The torch Pipeline sends its activations and
gradients here; the parameter servers run their own protocol (pickled objects probed from any
worker, and waits a dead worker does not end) on a channel's communicator. A binding turns its
tensors into arrays and back; it touches neither MPI nor the job's state.
"""

from collections.abc import Sequence
from typing import Optional

import numpy as np
from mpi4py import MPI

from ..agreement import digest
from ..process_sets import ProcessSet, communicator, global_process_set
from ..state import current, is_initialized

__all__ = ["Channel", "Transfer"]


class Transfer:
    """One non-blocking operation of a Channel; it keeps its buffer alive until complete."""

    __slots__ = ("channel", "buffer", "what", "_request")

    def __init__(self, channel: "Channel", request: MPI.Request, buffer, what: str):
        self.channel, self.buffer, self.what, self._request = channel, buffer, what, request

    def test(self) -> bool:
        """Return whether it has completed (without waiting)."""
        return self._request.Test()

    def wait(self, what: Optional[str] = None) -> None:
        """Wait until it completes, with the job's checks.

        Args:
            what: what this rank waits for, for messages ("pipeline stage 1 waiting for
                gradients"); default: the operation and its peer.

        Raises:
            HorovodLiteError: a member of the channel shut down or exited, or the wait passed
                HOROVODLITE_COLLECTIVE_TIMEOUT (the job is then torn down, as for a collective).
        """
        self.channel.wait([self], what)


class Channel:
    """Point-to-point messages among the ranks of `process_set`, on a communicator of their own.

    Every member creates it, in the same order as its other collectives (duplicating the set's
    communicator is one). Ranks are the set's, 0 .. size - 1, as MPI's; `ranks` gives their
    global ranks. MPI keeps the order of the messages with one source and tag.

    Attributes:
        comm: the channel's communicator, for a protocol that must run MPI itself (the
            parameter servers': pickled objects from any source, waits a dead worker survives).
        rank, size: this rank's place in the set, and the set's size.
        ranks: the members' global ranks, in the set's order.

    Raises:
        TypeError, ValueError: `process_set` is not a registered set holding this rank.
        NotInitializedError: before init().
    """

    def __init__(self, process_set: ProcessSet = global_process_set):
        comm, ranks = communicator(process_set)
        self.comm: MPI.Intracomm = comm.Dup()
        self.ranks: list = list(ranks)
        self.rank, self.size = self.comm.rank, self.comm.size
        self._generation = current().generation

    @property
    def current(self) -> bool:
        """Whether the init() this channel was made under is still the job's (not shut down)."""
        return is_initialized() and current().generation == self._generation

    @property
    def timeout(self) -> float:
        """Seconds a wait may last: the job's HOROVODLITE_COLLECTIVE_TIMEOUT."""
        return current().settings.collective_timeout

    # -- operations ---------------------------------------------------------------------------

    def isend(self, buffer, dest: int, tag: int = 0) -> Transfer:
        """Start sending `buffer`'s bytes to rank `dest`; it must not change until sent."""
        request = self.comm.Isend(_bytes(buffer), dest, tag)
        return Transfer(self, request, buffer, f"a send to {self._named(dest)} (tag {tag})")

    def irecv(self, buffer, source: int, tag: int = 0) -> Transfer:
        """Start receiving a message from rank `source` into `buffer` (at least its size)."""
        request = self.comm.Irecv(_bytes(buffer, writable=True), source, tag)
        return Transfer(self, request, buffer, f"a message from {self._named(source)} (tag {tag})")

    def send(self, buffer, dest: int, tag: int = 0, what: Optional[str] = None) -> None:
        """Send `buffer` to rank `dest` and wait until it is sent (Transfer.wait's checks)."""
        self.isend(buffer, dest, tag).wait(what)

    def recv(self, buffer, source: int, tag: int = 0, what: Optional[str] = None):
        """Receive a message from rank `source` into `buffer`; return `buffer`."""
        self.irecv(buffer, source, tag).wait(what)
        return buffer

    def ibcast(self, buffer, root: int) -> Transfer:
        """Start broadcasting rank `root`'s `buffer` into every member's `buffer`.

        For small control values beside the messages (the collectives are for data).
        """
        request = self.comm.Ibcast(_bytes(buffer, writable=self.rank != root), root)
        return Transfer(self, request, buffer, f"a broadcast from {self._named(root)}")

    def iallgather(self, send, receive) -> Transfer:
        """Start gathering every member's `send` into `receive` (size times as large), in order.

        For a small table that every member then reads alike.
        """
        request = self.comm.Iallgather(_bytes(send), _bytes(receive, writable=True))
        return Transfer(self, request, (send, receive), "an allgather")

    def wait(self, transfers: Sequence[Transfer], what: Optional[str] = None) -> None:
        """Wait until every one of `transfers` completes (see Transfer.wait)."""
        for transfer in transfers:
            if transfer.test():
                continue
            about = what or transfer.what

            def identify(about=about) -> tuple:
                return about, digest({"point_to_point": about})

            # Every member counts, as in a collective: a member that left stops this wait sooner
            # or later, so it fails now, naming that member, not when a neighbour's error arrives.
            current().watch.wait(transfer._request, identify, self.ranks)

    def _named(self, rank: int) -> str:
        """Name a member by its global rank (MPI.ANY_SOURCE: any member)."""
        return f"rank {self.ranks[rank]}" if 0 <= rank < self.size else "any member"

    def close(self) -> None:
        """Free the channel's communicator; every member calls it, with nothing in flight."""
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()


def _bytes(buffer, writable: bool = False) -> list:
    """Return `buffer`'s memory as an MPI byte message, without copying.

    Raises:
        TypeError: not a buffer (a GPU array: copy it to the host first), or read-only where it
            is written.
        ValueError: not contiguous.
    """
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise ValueError("a message must be a contiguous array: np.ascontiguousarray() it")
        if writable and not buffer.flags.writeable:
            raise TypeError("a receive needs a writable array, got a read-only one")
        return [buffer.reshape(-1).view(np.uint8), MPI.BYTE]  # any dtype, bfloat16 too
    try:
        memory = memoryview(buffer)
    except TypeError:
        raise TypeError(
            f"a message must be a host buffer (a numpy array, bytes, bytearray), got "
            f"{type(buffer).__name__}: copy a device array to the host first"
        ) from None
    if not memory.c_contiguous:
        raise ValueError("a message must be a contiguous buffer")
    if writable and memory.readonly:
        raise TypeError(
            f"a receive needs a writable buffer, got a read-only {type(buffer).__name__}"
        )
    return [memory.cast("B"), MPI.BYTE]
