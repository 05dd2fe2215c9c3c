"""Staging GPU data through pinned host memory (horovodlite/staging.py), in one process.

No GPU here: a stand-in for CuPy whose copies up to the "GPU" are queued, as CUDA queues them
on a stream, and run only when an event after them is waited for or a copy down waits for the
stream. A staged result that the host overwrote before its copy up ran would come out wrong.
"""

import threading
import types

import numpy as np
import pytest

from horovodlite import staging

_queued: list = []  # copies up, in stream order, not yet run


def _run_queued() -> None:
    while _queued:
        _queued.pop(0)()


class _Event:
    def __init__(self, block=False, disable_timing=False):
        self.recorded = 0

    def record(self):
        self.recorded = len(_queued)

    def synchronize(self):
        _run_queued()  # (the copies before the event run, and the later ones with them)


class DeviceArray(np.ndarray):
    """A "GPU" array: numpy memory that the host reaches only through get() and set()."""

    def get(self, out):
        _run_queued()  # CuPy's get waits for the stream, whose queued copies come first
        np.copyto(out, self.view(np.ndarray))
        return out

    def __setitem__(self, key, value):
        _run_queued()  # a kernel queued after the copies: it runs after them
        super().__setitem__(key, value)

    def set(self, host):
        assert host.shape == self.shape and host.flags.c_contiguous
        target = self.view(np.ndarray)
        _queued.append(lambda: np.copyto(target, host))  # reads `host` when it runs


def _empty(shape, dtype):
    return np.empty(shape, dtype=dtype).view(DeviceArray)


def _device(values):
    return np.asarray(values).view(DeviceArray).copy()


GPU = types.SimpleNamespace(
    empty=_empty,
    cuda=types.SimpleNamespace(alloc_pinned_memory=bytearray, Event=_Event),
)
STAGED = types.SimpleNamespace(device=False, host_reads=True)  # a transport: MPI


@pytest.fixture(autouse=True)
def fresh_buffers():
    """Each test starts with no pinned buffers and no queued copies."""
    staging._pinned.__dict__.clear()
    _queued.clear()
    yield
    staging._pinned.__dict__.clear()
    _queued.clear()


def _is_pinned(array) -> bool:
    return any(np.may_share_memory(held.array, array) for held in staging._pinned.buffers.values())


def test_an_input_goes_down_into_the_reused_pinned_work_buffer():
    x = _device(np.arange(12, dtype=np.float32).reshape(3, 4))
    buf, module = staging.flat_work(x, GPU, False, STAGED)
    assert module is np and type(buf) is np.ndarray and buf.shape == (12,)
    np.testing.assert_array_equal(buf, np.arange(12))
    assert _is_pinned(buf)
    again, _ = staging.flat_work(_device(np.ones(5, np.float32)), GPU, False, STAGED)
    assert np.may_share_memory(again, buf)  # reused, not a new buffer each call
    # A strided input goes down in its logical order.
    strided, _ = staging.flat_work(x[:, ::2], GPU, False, STAGED)
    np.testing.assert_array_equal(strided, [0, 2, 4, 6, 8, 10])


def test_a_staged_result_goes_up_once_its_copy_has_run_before_the_buffer_is_written_again():
    # The result of one collective is queued up from the pinned result buffer; the next
    # collective's result is written into that buffer by the host (MPI). Without the wait, the
    # first copy up would read the second result.
    first_host = staging.result_buffer(np, GPU, 4, np.dtype(np.float32))
    first_host[:] = [1, 2, 3, 4]
    template = _device(np.zeros(4, np.float32))
    first = staging.deliver(first_host, template, GPU, False)
    assert type(first) is DeviceArray and not _is_pinned(first)
    assert _queued  # its copy up has not run: the host did not wait for it
    second_host = staging.result_buffer(np, GPU, 4, np.dtype(np.float32))
    assert np.may_share_memory(second_host, first_host) and not _queued
    second_host[:] = [5, 6, 7, 8]
    second = staging.deliver(second_host, template, GPU, False)
    _run_queued()
    np.testing.assert_array_equal(first.view(np.ndarray), [1, 2, 3, 4])
    np.testing.assert_array_equal(second.view(np.ndarray), [5, 6, 7, 8])


def test_an_in_place_result_goes_up_into_the_array_itself():
    x = _device(np.zeros((2, 3), np.float32))
    buf, _ = staging.flat_work(x, GPU, False, STAGED)
    buf[:] = np.arange(6)
    assert staging.deliver(buf, x, GPU, True) is x
    _run_queued()
    np.testing.assert_array_equal(x.view(np.ndarray), np.arange(6).reshape(2, 3))
    # A strided one through a contiguous copy; and a factor scales it on the host first.
    y = _device(np.zeros((2, 6), np.float32))
    view = y[:, ::2]
    buf, _ = staging.flat_work(view, GPU, False, STAGED)
    buf[:] = np.arange(6)
    assert staging.deliver(buf, view, GPU, True, factor=0.5) is view
    _run_queued()
    np.testing.assert_array_equal(y.view(np.ndarray)[:, ::2], np.arange(6).reshape(2, 3) / 2)
    np.testing.assert_array_equal(y.view(np.ndarray)[:, 1::2], 0)


def test_each_role_and_dtype_has_its_own_buffer_and_a_grown_one_waits_first():
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    work = staging.host_scratch(GPU, f32, 8, "work")
    held = [
        work,
        staging.host_scratch(GPU, f32, 8, "result"),
        staging.host_scratch(GPU, f64, 8, "work"),
        staging.host_scratch(GPU, f32, 8),
    ]
    for i, a in enumerate(held):
        for b in held[i + 1 :]:
            assert not np.may_share_memory(a, b)
    work[:] = 3
    staging.deliver(work, _device(np.zeros(8, np.float32)), GPU, False)
    grown = staging.host_scratch(GPU, f32, 64, "work")  # a new, larger buffer: the old one's
    assert not _queued and grown.size == 64  # copy up ran before its memory could go back


def test_pinned_buffers_are_per_thread():
    mine = staging.host_scratch(GPU, np.dtype(np.float32), 4, "work")
    theirs = []
    thread = threading.Thread(
        target=lambda: theirs.append(staging.host_scratch(GPU, np.dtype(np.float32), 4, "work"))
    )
    thread.start()
    thread.join()
    assert not np.may_share_memory(mine, theirs[0])
