"""Fixtures for modules that run on every rank of a job across simulated hosts."""

import pytest

import horovodlite as hvd


@pytest.fixture(scope="session", autouse=True)
def initialized():
    hvd.init()
    yield
    hvd.shutdown()
