"""Unit tests of the fused gradient path's helpers (issue #27): gathering, scaled results."""

import time

import numpy as np
import pytest

from horovodlite.staging import deliver, scale
from horovodlite.wakeup import GATHER_ACROSS_HOSTS, GATHER_ONE_HOST, gathering_left


@pytest.mark.parametrize("quiet, longest", [GATHER_ACROSS_HOSTS, GATHER_ONE_HOST])
def test_gathering_goes_on_while_requests_keep_coming(quiet, longest):
    # Times in the future and past by far, so that a descheduled test changes nothing.
    assert gathering_left([], quiet, longest) == 0.0  # nothing of our own: cycle at once
    assert gathering_left([time.monotonic() - 100], quiet, longest) == 0.0  # quiet for long
    future = time.monotonic() + 100
    recent = gathering_left([future], quiet, longest)  # `quiet` after the newest
    # `longest` after the oldest comes first
    capped = gathering_left([future - longest - 0.1, future], quiet, longest)
    assert 100 + quiet - 1 < recent <= 100 + quiet
    assert capped <= recent - 0.1 + 1e-9


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("factor", [1.0, 0.5, 1 / 3])
def test_a_result_scaled_on_its_way_back_rounds_as_scale_in_place(dtype, factor):
    buf = (np.arange(-7, 17) * 3).astype(dtype)
    expected = buf.copy()
    scale(np, expected, factor)
    target = np.zeros((4, 6), dtype=dtype)
    out = deliver(buf.copy(), target, np, inplace=True, factor=factor)
    assert out is target
    np.testing.assert_array_equal(target.reshape(-1), expected)
    fresh = deliver(buf.copy(), target, np, inplace=False, factor=factor)
    assert not np.shares_memory(fresh, target)
    np.testing.assert_array_equal(fresh.reshape(-1), expected)


def test_a_result_scaled_into_a_strided_array_lands_there():
    buf = np.arange(6, dtype=np.float32)
    target = np.zeros((6, 2), dtype=np.float32)[:, 0]
    out = deliver(buf.copy(), target, np, inplace=True, factor=2.0)
    assert out is target
    np.testing.assert_array_equal(target, buf * 2)
