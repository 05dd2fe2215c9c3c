"""Unit tests of the fused gradient path's helpers (issue #27): gathering and scaled copies."""

import time

import numpy as np
import pytest

from horovodlite.staging import scale, scaled_copy
from horovodlite.wakeup import gathering_left


def test_gathering_goes_on_while_requests_keep_coming():
    # Times in the future and past by far, so that a descheduled test changes nothing.
    assert gathering_left([]) == 0.0  # nothing of our own: cycle at once
    assert gathering_left([time.monotonic() - 100]) == 0.0  # quiet for long
    future = time.monotonic() + 100
    recent = gathering_left([future])  # 50 ms after the newest
    capped = gathering_left([future - 0.6, future])  # 0.5 s after the oldest comes first
    assert 99 < recent <= 100.05
    assert capped <= recent - 0.15 + 1e-9


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("factor", [1.0, 0.5, 1 / 3])
def test_scaled_copy_rounds_as_scale_in_place(dtype, factor):
    buf = (np.arange(-7, 17) * 3).astype(dtype)
    expected = buf.copy()
    scale(np, expected, factor)
    target = np.zeros((4, 6), dtype=dtype)
    out = scaled_copy(np, buf, factor, target)
    assert np.shares_memory(out, target)
    np.testing.assert_array_equal(target.reshape(-1), expected)
    fresh = scaled_copy(np, buf, factor)
    assert not np.shares_memory(fresh, buf)
    np.testing.assert_array_equal(fresh, expected)


def test_scaled_copy_into_a_strided_target_returns_a_new_array():
    buf = np.arange(6, dtype=np.float32)
    target = np.zeros((6, 2), dtype=np.float32)[:, 0]
    out = scaled_copy(np, buf, 2.0, target)
    assert not np.shares_memory(out, target)
    np.testing.assert_array_equal(out, buf * 2)
