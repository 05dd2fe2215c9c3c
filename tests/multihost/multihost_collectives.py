"""Run on every rank of a job on a simulated cluster (tests/test_simcluster.py starts it).

Ranks fill the hosts' slots in order: with S slots per host, rank r is on host r // S. The
oracles are numpy computations of what every rank contributed (each rank can regenerate the
others' inputs from their seeds), and the network namespace each process runs in.
"""

import dataclasses
import os
import zlib

import ml_dtypes
import numpy as np
import pytest

import horovodlite as hvd
from horovodlite.wakeup import GATHER_ACROSS_HOSTS

SLOTS = int(os.environ["HOROVODLITE_TEST_SLOTS_PER_HOST"])
ROOT_NETNS = int(os.environ["HOROVODLITE_TEST_ROOT_NETNS"])
ALGORITHMS = ("ring", "naive", "mpi", "hierarchical")
DTYPES = (np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.uint8)
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max}


def contribution(rank: int, shape, dtype, seed: int) -> np.ndarray:
    """Return rank `rank`'s input: small integers, exact in every dtype and in their sums."""
    rng = np.random.default_rng([seed, rank])
    low = 0 if np.dtype(dtype).kind == "u" else -8
    return rng.integers(low, 8, size=shape).astype(dtype)


def all_contributions(shape, dtype, seed: int) -> np.ndarray:
    return np.stack(
        [contribution(r, shape, dtype, seed).astype(np.float64) for r in range(hvd.size())]
    )


def reduce_oracle(stacked: np.ndarray, op_name: str, integer: bool = False) -> np.ndarray:
    # Integer averages are scaled in float64 and truncated toward zero, as in Horovod.
    return {
        "Sum": lambda a: a.sum(axis=0),
        "Average": lambda a: (np.trunc if integer else np.asarray)(a.sum(axis=0) * (1 / len(a))),
        "Min": lambda a: a.min(axis=0),
        "Max": lambda a: a.max(axis=0),
    }[op_name](stacked)


def test_placement_and_topology():
    rank, size = hvd.rank(), hvd.size()
    assert size % SLOTS == 0, f"the test expects full hosts, got {size} ranks, {SLOTS} slots"
    assert hvd.local_rank() == rank % SLOTS
    assert hvd.local_size() == SLOTS
    assert hvd.cross_rank() == rank // SLOTS
    assert hvd.cross_size() == size // SLOTS
    assert hvd.is_homogeneous()
    # Across hosts the engine gathers requests for the shorter time (wakeup.py).
    assert hvd.state.current().engine._gather == GATHER_ACROSS_HOSTS
    # The independent oracle: which network namespace (simulated host) each process is in.
    namespaces = hvd.allgather_object(os.stat("/proc/self/ns/net").st_ino)
    assert ROOT_NETNS not in namespaces, "a rank runs in the root network namespace"
    for a in range(size):
        for b in range(size):
            assert (namespaces[a] == namespaces[b]) == (a // SLOTS == b // SLOTS), namespaces


@pytest.mark.parametrize("count", [0, 1, 7, 1000])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce(algorithm, op_name, dtype, count):
    seed = zlib.crc32(f"{algorithm}/{op_name}/{count}".encode())  # the same on every rank
    mine = contribution(hvd.rank(), (count,), dtype, seed)
    out = hvd.allreduce(mine, op=OPS[op_name], algorithm=algorithm)
    stacked = all_contributions((count,), dtype, seed)
    expected = reduce_oracle(stacked, op_name, np.dtype(dtype).kind in "iu").astype(dtype)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out.astype(np.float64), expected.astype(np.float64))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_large_allreduce_over_the_network(algorithm):
    count = (1 << 20) + 3  # 4 MiB of float32: several ring segments per host link
    mine = contribution(hvd.rank(), (count,), np.float32, 7)
    out = hvd.allreduce(mine, op=hvd.Sum, algorithm=algorithm, name=f"large.{algorithm}")
    expected = all_contributions((count,), np.float32, 7).sum(axis=0).astype(np.float32)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("count", [3, 1001, (1 << 18) + 7])
def test_hierarchical_allreduce_is_bitwise_equal_on_every_rank(count):
    # Random floats, whose sums round differently in every order: each element's final value
    # must still be computed once and copied, so all ranks hold the same bits.
    rng = np.random.default_rng([count, hvd.rank()])
    mine = rng.standard_normal(count).astype(np.float32)
    out = hvd.allreduce(mine, op=hvd.Average, algorithm="hierarchical", name=f"bits.{count}")
    results = hvd.allgather_object(out.tobytes())
    assert all(r == results[0] for r in results)
    # It took the hierarchical path (2 hosts of 2 ranks), not the flat ring it falls back to.
    assert any(t is not None for t in hvd.algorithms.hierarchical._topologies.values())
    inputs = hvd.allgather_object(mine)
    np.testing.assert_allclose(out, np.mean(inputs, axis=0, dtype=np.float64), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(0,), (5, 3), (100_000,)])
@pytest.mark.parametrize("dtype", [np.float64, np.int32, ml_dtypes.bfloat16])
def test_broadcast_from_every_root(shape, dtype):
    for root in range(hvd.size()):
        out = hvd.broadcast(contribution(hvd.rank(), shape, dtype, root), root_rank=root)
        np.testing.assert_array_equal(out, contribution(root, shape, dtype, root))


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_allgather_uneven_rows(dtype):
    def rows(rank):
        return rank % 3  # rank 0 sends no rows

    out = hvd.allgather(contribution(hvd.rank(), (rows(hvd.rank()), 4), dtype, 11))
    expected = np.concatenate([contribution(r, (rows(r), 4), dtype, 11) for r in range(hvd.size())])
    np.testing.assert_array_equal(out, expected)


def test_default_choice_goes_host_by_host_above_one_mib(monkeypatch):
    calls = []

    def counting(name, function):
        def run(*args, **kwargs):
            calls.append(name)
            return function(*args, **kwargs)

        return run

    monkeypatch.setitem(
        hvd.algorithms.ALLREDUCE,
        "hierarchical",
        counting("allreduce", hvd.algorithms.ALLREDUCE["hierarchical"]),
    )
    monkeypatch.setattr(
        hvd.algorithms,
        "hierarchical_allgatherv",
        counting("allgather", hvd.algorithms.hierarchical_allgatherv),
    )
    small = contribution(hvd.rank(), (1000,), np.float32, 14)
    large = contribution(hvd.rank(), ((1 << 18) + 5,), np.float32, 14)  # just over 1 MiB
    hvd.allreduce(small, op=hvd.Sum, name="auto.small")
    hvd.allgather(small, name="auto.small.gather")
    assert calls == []
    out = hvd.allreduce(large, op=hvd.Sum, name="auto.large")
    gathered = hvd.allgather(large, name="auto.large.gather")
    assert calls == ["allreduce", "allgather"]
    np.testing.assert_array_equal(
        out, all_contributions(large.shape, np.float32, 14).sum(axis=0).astype(np.float32)
    )
    np.testing.assert_array_equal(
        gathered,
        np.concatenate([contribution(r, large.shape, np.float32, 14) for r in range(hvd.size())]),
    )


@pytest.fixture
def hierarchical_allgather():
    """HOROVODLITE_HIERARCHICAL_ALLGATHER=1 for one test (init() has read the environment)."""
    state = hvd.state.current()
    saved = state.settings
    state.settings = dataclasses.replace(saved, hierarchical_allgather=True)
    yield
    state.settings = saved


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, ml_dtypes.bfloat16])
@pytest.mark.parametrize("rows_of", [lambda r: r % 3, lambda r: 1000 + r, lambda r: 0])
def test_hierarchical_allgather(hierarchical_allgather, dtype, rows_of):
    out = hvd.allgather(contribution(hvd.rank(), (rows_of(hvd.rank()), 3), dtype, 12))
    expected = np.concatenate(
        [contribution(r, (rows_of(r), 3), dtype, 12) for r in range(hvd.size())]
    )
    np.testing.assert_array_equal(out, expected)
    hosts = [t.hosts for t in hvd.algorithms.hierarchical._topologies.values() if t is not None]
    assert hosts and all(len(h) == hvd.size() // SLOTS for h in hosts), "not gathered by host"


def test_hierarchical_allgather_into(hierarchical_allgather):
    counts = [(r * 7) % 5 + 1 for r in range(hvd.size())]
    start = sum(counts[: hvd.rank()])
    out = np.full((sum(counts), 2), -1.0)
    out[start : start + counts[hvd.rank()]] = contribution(hvd.rank(), (counts[hvd.rank()], 2),
                                                           np.float64, 13)  # fmt: skip
    hvd.allgather_into(out, counts[hvd.rank()])
    expected = np.concatenate(
        [contribution(r, (counts[r], 2), np.float64, 13) for r in range(hvd.size())]
    )
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("rows", [1, 4, 7, 1001])
@pytest.mark.parametrize("op_name", ["Sum", "Average"])
@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_reducescatter(algorithm, op_name, rows):
    size, rank = hvd.size(), hvd.rank()
    seed = rows * 10 + len(op_name)
    out = hvd.reducescatter(
        contribution(rank, (rows, 3), np.float64, seed), op=OPS[op_name], algorithm=algorithm
    )
    total = reduce_oracle(all_contributions((rows, 3), np.float64, seed), op_name)
    # Horovod's split: the first rows % size ranks get one row more.
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    np.testing.assert_array_equal(out, total[start : start + counts[rank]])


def test_alltoall_even():
    size, rank = hvd.size(), hvd.rank()
    send = np.arange(2 * size * 3, dtype=np.int32).reshape(2 * size, 3) + 1000 * rank
    out = hvd.alltoall(send)
    expected = np.concatenate(
        [(np.arange(2 * size * 3, dtype=np.int32).reshape(2 * size, 3) + 1000 * r)[
            2 * rank : 2 * rank + 2] for r in range(size)]
    )  # fmt: skip
    np.testing.assert_array_equal(out, expected)


def test_alltoall_with_splits():
    size, rank = hvd.size(), hvd.rank()

    def splits_of(r):
        return np.array([(r + j) % 3 for j in range(size)])

    def data_of(r):
        return contribution(r, (int(splits_of(r).sum()), 2), np.float32, 5)

    out, received = hvd.alltoall(data_of(rank), splits=splits_of(rank))
    pieces = []
    for r in range(size):
        offsets = np.concatenate(([0], np.cumsum(splits_of(r))))
        pieces.append(data_of(r)[offsets[rank] : offsets[rank + 1]])
    np.testing.assert_array_equal(out, np.concatenate(pieces))
    np.testing.assert_array_equal(received, [splits_of(r)[rank] for r in range(size)])


def test_mismatch_raises_on_every_host():
    shape = (3,) if hvd.rank() == hvd.size() - 1 else (4,)
    with pytest.raises(hvd.MismatchError):
        hvd.allreduce(np.zeros(shape, np.float32), name="mismatch.across.hosts")
