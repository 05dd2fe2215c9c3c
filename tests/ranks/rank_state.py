"""Process state on every rank, checked against MPI's own view of the job."""

import numpy as np
import pytest
from mpi4py import MPI
from oracle import WORLD, still_in_step

import horovodlite as hvd
from horovodlite import state


def test_size_and_rank_match_comm_world():
    assert hvd.is_initialized()
    assert hvd.size() == WORLD.size
    assert hvd.rank() == WORLD.rank
    assert WORLD.allgather(hvd.rank()) == list(range(WORLD.size))


def test_local_and_cross_ranks_match_shared_memory_split():
    shared = WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=WORLD.rank)
    try:
        assert hvd.local_size() == shared.size
        assert hvd.local_rank() == shared.rank
        local_sizes = WORLD.allgather(shared.size)
    finally:
        shared.Free()
    everyone = WORLD.allgather((hvd.local_rank(), hvd.cross_rank(), hvd.cross_size()))
    # The ranks with one local rank form a cross group: one member per host, ranked in order.
    for local, cross, cross_size in everyone:
        peers = [k for k, (other, _, _) in enumerate(everyone) if other == local]
        assert cross_size == len(peers)
        assert cross in range(cross_size)
    mine = [c for (local, c, _) in everyone if local == hvd.local_rank()]
    assert mine == list(range(len(mine)))
    assert hvd.is_homogeneous() == (len(set(local_sizes)) == 1)
    # The test job runs on one host.
    assert (hvd.local_size(), hvd.cross_size(), hvd.cross_rank()) == (hvd.size(), 1, 0)


def test_mpi_threads_supported_matches_mpi():
    assert hvd.mpi_threads_supported() == (MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    assert isinstance(hvd.mpi_threads_supported(), bool)


def test_init_twice_is_harmless():
    before = state.current()
    hvd.init()
    hvd.init()
    assert state.current() is before
    assert hvd.size() == WORLD.size
    still_in_step()


def test_library_traffic_is_separate_from_the_users():
    # horovodlite talks on a duplicate of COMM_WORLD, so a user message pending on COMM_WORLD
    # is neither consumed nor disturbed by a collective.
    n, r = hvd.size(), hvd.rank()
    assert MPI.Comm.Compare(state.current().comm, WORLD) == MPI.CONGRUENT
    request = WORLD.isend(f"user {r}", dest=(r + 1) % n, tag=7)
    out = hvd.allreduce(np.ones(3), op=hvd.Sum, algorithm="ring")
    np.testing.assert_array_equal(out, np.full(3, n))
    assert WORLD.recv(source=(r - 1) % n, tag=7) == f"user {(r - 1) % n}"
    request.wait()


def test_shutdown_then_init_again():
    hvd.shutdown()
    hvd.shutdown()  # safe to call twice
    assert not hvd.is_initialized()
    with pytest.raises(hvd.NotInitializedError, match=r"call hvd.init\(\) first"):
        hvd.rank()
    with pytest.raises(hvd.NotInitializedError):
        hvd.allreduce(np.ones(1))
    hvd.init()
    assert hvd.is_initialized() and hvd.rank() == WORLD.rank
    still_in_step()
