"""Run on every rank of a job across simulated hosts with HOROVODLITE_TRANSPORT=gloo.

tests/test_simcluster.py starts it twice: with an interface named (the Gloo groups must span the
hosts and give exact results), and with none while the host name resolves to loopback, as on
most machines (every rank must raise at once, naming the fix, instead of waiting for
connections that never come).
"""

import os

import horovodlite.torch as hvd_torch
import numpy as np
import pytest
import torch

import horovodlite as hvd
from horovodlite.hosts import one_host
from horovodlite.transport import select

EXPECT = os.environ["HOROVODLITE_TEST_GLOO_EXPECT"]  # "works" or "unreachable"


def contribution(rank: int, count: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng([7, rank]).integers(-8, 8, count).astype("f4"))


def test_the_data_goes_over_gloo_across_hosts():
    assert hvd.size() >= 2 and hvd.state.current().settings.transport == "gloo"
    assert select(hvd.state.current().settings, np, hvd.Sum, np.dtype("f4")).name == "gloo"
    assert not one_host(hvd.state.current().comm)


@pytest.mark.skipif(EXPECT != "works", reason="the groups cannot be built here")
def test_collectives_across_hosts():
    count = 300_001  # over one ring segment, not divisible by the ranks
    total = hvd_torch.allreduce(contribution(hvd.rank(), count), op=hvd.Sum, name="gloo.ar")
    expected = sum(contribution(r, count) for r in range(hvd.size()))
    assert torch.equal(total, expected)
    rows = hvd_torch.allgather(torch.full((hvd.rank() + 1, 2), float(hvd.rank())), name="gloo.ag")
    assert rows.tolist() == [[float(r)] * 2 for r in range(hvd.size()) for _ in range(r + 1)]
    root = hvd.size() - 1
    sent = hvd_torch.broadcast(torch.arange(5.0) * (hvd.rank() + 1), root, name="gloo.bc")
    assert torch.equal(sent, torch.arange(5.0) * (root + 1))


@pytest.mark.skipif(EXPECT != "unreachable", reason="an interface is named")
def test_a_host_name_on_loopback_fails_at_once_on_every_rank():
    with pytest.raises(hvd.HorovodLiteError, match="HOROVODLITE_GLOO_IFACE") as error:
        hvd_torch.allreduce(contribution(hvd.rank(), 10), op=hvd.Sum, name="gloo.unreachable")
    assert "resolves to 127." in str(error.value) and "cannot reach" in str(error.value)
