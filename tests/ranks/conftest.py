"""Fixtures for test modules that run on every rank of an MPI job (see tests/test_ranks.py).

A test that fails on one rank ends the whole job: the other ranks may wait in a collective that
the failed rank left, and would otherwise sit there until the launcher's timeout. The failing
rank prints its failure at once (pytest would print it only at the end of the session), gives
the other ranks a moment to report theirs, then aborts the job.
"""

import sys
import time

import pytest
from mpi4py import MPI

import horovodlite as hvd

_GRACE = 2.0  # seconds the other ranks get to print their own failure of the same test


@pytest.fixture(scope="session", autouse=True)
def initialized():
    hvd.init()
    yield
    hvd.shutdown()


def pytest_runtest_logreport(report):
    if not report.failed:
        return
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    sys.stdout.flush()
    sys.stderr.write(
        f"\n[rank {rank} of {size}] FAILED {report.nodeid} ({report.when}):\n"
        f"{report.longreprtext}\n[rank {rank} of {size}] aborting the job\n"
    )
    sys.stderr.flush()
    time.sleep(_GRACE)
    MPI.COMM_WORLD.Abort(1)
