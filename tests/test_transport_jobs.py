"""Nothing hangs inside a transport: a rank that leaves after data moved over Gloo or NCCL ends
the job with an error naming it on the other ranks, found over MPI (tests/jobs/)."""

import importlib.util
import re

import pytest
from test_engine_jobs import job

pytestmark = pytest.mark.mpi

BOUND = 30  # seconds from a rank leaving to the error on the others


def _has_torch_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _skip_unless(transport: str) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch")
    if transport == "nccl" and not _has_torch_cuda():
        pytest.skip("needs torch with CUDA and a GPU per rank")
    if transport == "cupy-nccl" and (
        importlib.util.find_spec("cupy") is None or not _has_torch_cuda()
    ):
        pytest.skip("needs CuPy with NCCL and a GPU per rank")


@pytest.mark.parametrize("how", ["exit0", "exit1"])
@pytest.mark.parametrize("transport", ["gloo", "nccl", "cupy-nccl"])
def test_a_rank_that_leaves_after_the_transport_moved_data_ends_the_job(transport, how):
    _skip_unless(transport)
    result = job(3, "transport_early_exit.py", transport, how, module_runner=False)
    assert result.returncode != 0, result.stdout
    for rank in (0, 2):
        found = re.search(rf"rank {rank} raised after ([0-9.]+) s: (.*)", result.stdout)
        assert found, result.stdout
        assert float(found.group(1)) < BOUND, result.stdout
        assert "rank 1 exited" in found.group(2), result.stdout
    assert "was not stopped" not in result.stdout, result.stdout
