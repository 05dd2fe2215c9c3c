"""The Lightning strategy's choice of GPU, against faked device counts (no GPU needed)."""

import pytest

pytest.importorskip("pytorch_lightning")

from horovodlite.lightning.strategy import _gpu_index  # noqa: E402


@pytest.mark.parametrize("transport", ["auto", "mpi", "nccl"])
def test_one_gpu_per_rank_where_there_are_enough(transport):
    assert [_gpu_index(r, 4, 4, transport) for r in range(4)] == [0, 1, 2, 3]
    assert [_gpu_index(r, 2, 8, transport) for r in range(2)] == [0, 1]


def test_ranks_share_the_gpus_only_over_mpi():
    assert [_gpu_index(r, 3, 2, "mpi") for r in range(3)] == [0, 1, 0]
    assert [_gpu_index(r, 2, 1, "mpi") for r in range(2)] == [0, 0]


@pytest.mark.parametrize("transport", ["auto", "nccl", "cupy-nccl", "gloo"])
def test_more_ranks_than_gpus_names_the_fix(transport):
    # Every rank of the host raises, local rank 0 too: none goes on to wait for the others.
    for rank in range(2):
        with pytest.raises(ValueError, match="with 2 ranks on host .* but 1 GPU ") as info:
            _gpu_index(rank, 2, 1, transport)
        message = str(info.value)
        assert "at most 1 rank per host" in message and "HOROVODLITE_TRANSPORT=mpi" in message


def test_no_gpu_says_so():
    with pytest.raises(ValueError, match="torch sees no GPU"):
        _gpu_index(0, 1, 0, "mpi")
