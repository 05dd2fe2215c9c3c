"""Fixtures for test modules that run on every rank of an MPI job (see tests/test_ranks.py)."""

import pytest

import horovodlite as hvd


@pytest.fixture(scope="session", autouse=True)
def initialized():
    hvd.init()
    yield
    hvd.shutdown()
