"""The cluster environment of a horovodlite job: ranks and sizes come from horovodlite."""

import os

import horovodlite.torch as hvd
from lightning_fabric.plugins import ClusterEnvironment

__all__ = ["HorovodLiteEnvironment"]

# Variables that MPICH's Hydra, Open MPI and PMIx (srun) set in every process they start.
_LAUNCHER_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def _initialized() -> None:
    if not hvd.is_initialized():
        hvd.init()


class HorovodLiteEnvironment(ClusterEnvironment):
    """Ranks, sizes and the node of this process, as horovodlite sees them.

    The processes are started by mpiexec or horovodlite-run, never by Lightning; horovodlite is
    initialized at the first question.
    """

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        # Only torch.distributed needs a rendezvous address; horovodlite meets over MPI.
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        """Return whether this process was started by an MPI launcher or runs horovodlite."""
        return hvd.is_initialized() or any(name in os.environ for name in _LAUNCHER_RANK_VARIABLES)

    def world_size(self) -> int:
        _initialized()
        return hvd.size()

    def set_world_size(self, size: int) -> None:
        pass  # the launcher decides; Lightning's guess from devices/num_nodes does not apply

    def global_rank(self) -> int:
        _initialized()
        return hvd.rank()

    def set_global_rank(self, rank: int) -> None:
        pass  # as set_world_size

    def local_rank(self) -> int:
        _initialized()
        return hvd.local_rank()

    def node_rank(self) -> int:
        _initialized()
        return hvd.cross_rank()
