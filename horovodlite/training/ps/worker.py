"""A worker's side of the messages: pull, fetch rows, push, finish; framework free.

Sends are non-blocking and kept until complete, so a push goes out while the worker loads its
next batch; replies are waited for with waits.wait_for, whole messages included
(messages.py), which notices a server that died (its shard of the parameters is lost with it:
the job cannot go on) and a wait past `timeout`.
"""

import time

import numpy as np
from mpi4py import MPI

from horovodlite.exceptions import HorovodLiteError

from . import messages
from . import protocol as p
from .layout import owner_of_rows
from .waits import wait_for

__all__ = ["WorkerClient"]


class WorkerClient:
    """The messages of one worker to every server.

    Args:
        comm: the job's own duplicate communicator.
        servers: the server ranks, in shard order.
        peers: rank -> waits.Peer.
        sparse_bounds: {embedding index: row bounds of the servers (servers + 1 numbers)}.
        timeout: seconds one wait for a server may last.
        resumable: whether the servers checkpoint (what a server's death then means differs).
    """

    def __init__(self, comm, servers, peers, sparse_bounds: dict, timeout: float,
                 resumable: bool = False):  # fmt: skip
        self.comm, self.servers, self.peers = comm, list(servers), peers
        self.sparse_bounds, self.timeout, self.resumable = sparse_bounds, timeout, resumable
        self.versions = [0] * len(self.servers)  # each server's update the parameters came from
        self.step = 0
        self._sends: list = []
        self.bytes_sent = self.bytes_received = 0

    # -- dense parameters ---------------------------------------------------------------------

    def request_params(self) -> None:
        """Ask every server for the dense parameters of this worker's next step."""
        for server in self.servers:
            self._send(server, p.PULL, self.step)

    def receive_params(self) -> list:
        """Wait for the parameters asked for; return each server's list of dense pieces."""
        pieces = []
        for k, server in enumerate(self.servers):
            self.versions[k], dense = self._receive(server, p.PARAMS, "its parameters")
            pieces.append(dense)
        return pieces

    # -- embedding rows -----------------------------------------------------------------------

    def rows(self, index: int, rows: np.ndarray) -> np.ndarray:
        """Return the current values of `rows` (unique, int64) of embedding `index`."""
        owners = owner_of_rows(self.sparse_bounds[index], rows)
        asked = [k for k in range(len(self.servers)) if np.any(owners == k)]
        for k in asked:
            self._send(self.servers[k], p.ROWS, {index: rows[owners == k]})
        values = None
        for k in asked:
            part = self._receive(self.servers[k], p.ROW_VALUES, "embedding rows")[index]
            if values is None:
                values = np.empty((len(rows),) + part.shape[1:], part.dtype)
            values[owners == k] = part
        return values

    def split_rows(self, index: int, rows: np.ndarray, values: np.ndarray) -> list:
        """Split the gradient rows of embedding `index` by server: a (rows, values) per server."""
        owners = owner_of_rows(self.sparse_bounds[index], rows)
        return [(rows[owners == k], values[owners == k]) for k in range(len(self.servers))]

    # -- pushing and finishing ----------------------------------------------------------------

    def push(self, dense: list, sparse: list) -> None:
        """Send this step's gradients: per server, its dense pieces and {index: (rows, values)}.

        The arrays must not change until the sends complete (the next push waits for them).
        """
        self._complete_sends()
        for k, server in enumerate(self.servers):
            self._send(server, p.PUSH, (self.versions[k], dense[k], sparse[k]))
        self.step += 1

    def finish(self) -> list:
        """Tell every server this worker is done; wait for each one's FINAL and return them.

        A server answers once every worker has finished or died, with its last parameters.
        """
        for server in self.servers:
            self._send(server, p.DONE, None)
        finals = [self._receive(s, p.FINAL, "the end of training") for s in self.servers]
        self._complete_sends()  # every server waits for our BYE: none has left yet
        for server in self.servers:
            self._send(server, p.BYE, None)
        self._complete_sends(final=True)
        self.comm.Free()  # every message to and from this worker has arrived
        return finals

    # -- plumbing -----------------------------------------------------------------------------

    def _send(self, server: int, tag: int, obj) -> None:
        self.bytes_sent += p.payload_bytes(obj)
        self._sends.append(messages.post(self.comm, obj, server, tag))

    def _complete_sends(self, final: bool = False) -> None:
        """Wait until every send of this worker is complete.

        With `final`, only the BYEs are left, and a server may leave as soon as it has read
        this worker's: a server gone, or a send MPI fails because it has gone, ends the wait
        rather than raising, as nothing it was sent matters any more.
        """
        gone: list = []

        def done():
            pending = []
            for request in self._sends:
                try:
                    if not request.test():
                        pending.append(request)
                except MPI.Exception as e:
                    if not final:
                        check()  # a server that died while it received: that error
                        raise HorovodLiteError(
                            f"worker rank {self.comm.rank}: a message to a "
                            f"parameter server failed in MPI: {e}"
                        ) from e
            self._sends = pending
            return True if not self._sends or gone else None

        start = time.monotonic()
        if not final:
            check = self._check_servers(self.servers, "its pushes to be received", start)
        else:

            def check():
                gone.extend(s for s in self.servers if not self.peers[s].alive(0, expected=False))
                if not gone and time.monotonic() - start > self.timeout:
                    raise HorovodLiteError(
                        f"worker rank {self.comm.rank}: its last messages to parameter servers "
                        f"{self.servers} were not received in {self.timeout:.0f} s"
                    )

        wait_for(done, check)

    def _receive(self, server: int, tag: int, what: str):
        check = self._check_servers([server], what, time.monotonic())
        obj = wait_for(lambda: messages.arrived(self.comm, server, tag), check).receive(check)
        self.bytes_received += p.payload_bytes(obj)
        self.peers[server].heard = time.monotonic()
        return obj

    def _check_servers(self, servers, what: str, start: float):
        def check():
            next_step = (
                "the servers checkpoint: started again (horovodlite-run's elastic mode does it "
                "by itself), the job resumes from their last common checkpoint"
                if self.resumable
                else "the servers do not checkpoint (hvd.ps.start(checkpoint_every=...)): "
                "restart the job from your own checkpoint"
            )
            for server in servers:
                peer = self.peers[server]
                if not peer.alive(self.timeout, expected=False):
                    raise HorovodLiteError(
                        f"parameter server rank {server} (pid {peer.pid} on {peer.host}) died "
                        f"while worker rank {self.comm.rank} waited for {what}: its shard of the "
                        f"parameters is lost, so training cannot go on; {next_step}"
                    )
            if time.monotonic() - start > self.timeout:
                raise HorovodLiteError(
                    f"worker rank {self.comm.rank} waited {self.timeout:.0f} s for {what} from "
                    f"parameter servers {servers}: no answer (a server on another host may have "
                    "died; raise HOROVODLITE_COLLECTIVE_TIMEOUT if a slow worker holds it back)"
                )

        return check
