"""Run on 3 ranks over 2 simulated hosts of 2 slots (tests/test_simcluster.py starts it).

Host 0 runs ranks 0 and 1, host 1 rank 2 alone: the ranks see different host sizes, yet every
rank must take the same algorithm, or a collective waits forever.
"""

import numpy as np

import horovodlite as hvd


def contribution(rank: int, shape, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, rank]).integers(-8, 8, size=shape).astype(np.float32)


def test_the_hosts_are_uneven():
    assert hvd.size() == 3
    assert hvd.local_size() == (2 if hvd.rank() < 2 else 1)


def test_large_allreduce_takes_the_flat_ring_on_every_rank():
    # The hierarchical all-reduce needs equal hosts: above 1 MiB the default is the ring here.
    count = (1 << 18) + 11
    out = hvd.allreduce(contribution(hvd.rank(), (count,), 3), op=hvd.Sum, name="uneven.ar")
    expected = sum(contribution(r, (count,), 3) for r in range(3))
    np.testing.assert_array_equal(out, expected)
    assert not hvd.algorithms.spans_hosts(hvd.state.current().comm)


def test_large_allgather_goes_host_by_host_on_every_rank():
    rows = [70_000, 5, 90_001]  # over 1 MiB of result in all
    out = hvd.allgather(contribution(hvd.rank(), (rows[hvd.rank()], 2), 4), name="uneven.ag")
    expected = np.concatenate([contribution(r, (rows[r], 2), 4) for r in range(3)])
    np.testing.assert_array_equal(out, expected)
    assert hvd.algorithms.hierarchical.gathers_by_host(hvd.state.current().comm)
