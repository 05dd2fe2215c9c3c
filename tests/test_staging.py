"""Staging GPU data through pinned host memory (horovodlite/staging.py), in one process.

No GPU here: a stand-in for CuPy (tests/ranks/stand_in_gpu.py) whose copies are queued as a
stream queues them and run only when something waits for them. A staged result that the host
overwrote before its copy up ran, or a piece moved before its copy down ran, comes out wrong.
tests/ranks/rank_staging.py runs the same code through the MPI transport at 1-4 ranks.
"""

import threading

import numpy as np
import pytest
from ranks import stand_in_gpu as gpu
from ranks.stand_in_gpu import GPU, DeviceArray, on_device, to_host

from horovodlite import staging

STAGED = type("Staged", (), {"device": False, "host_reads": True})()  # a transport: MPI
F32 = np.dtype(np.float32)


@pytest.fixture(autouse=True)
def fresh_buffers():
    """Each test starts with no pinned buffers and nothing queued."""
    staging._pinned.__dict__.clear()
    gpu.reset()
    yield
    staging._pinned.__dict__.clear()
    gpu.reset()


def _is_pinned(array) -> bool:
    return any(np.may_share_memory(held, array) for held in staging._pinned.buffers.values())


def test_an_input_goes_down_into_the_reused_pinned_work_buffer():
    x = on_device(np.arange(12, dtype=np.float32).reshape(3, 4))
    buf, module = staging.flat_work(x, GPU, False, STAGED)
    assert module is np and type(buf) is np.ndarray and buf.shape == (12,)
    np.testing.assert_array_equal(buf, np.arange(12))
    assert _is_pinned(buf)
    again, _ = staging.flat_work(on_device(np.ones(5, np.float32)), GPU, False, STAGED)
    assert np.may_share_memory(again, buf)  # reused, not a new buffer each call
    # A strided input goes down in its logical order.
    strided, _ = staging.flat_work(x[:, ::2], GPU, False, STAGED)
    np.testing.assert_array_equal(strided, [0, 2, 4, 6, 8, 10])


def test_a_staged_result_goes_up_once_its_copy_has_run_before_the_buffer_is_written_again():
    # The result of one collective is queued up from the pinned result buffer; the next
    # collective's result is written into that buffer by the host (MPI). Without the wait, the
    # first copy up would read the second result.
    first_host = staging.result_buffer(np, GPU, 4, F32)
    first_host[:] = [1, 2, 3, 4]
    template = on_device(np.zeros(4, np.float32))
    first = staging.deliver(first_host, template, GPU, False)
    assert type(first) is DeviceArray and not _is_pinned(first)
    assert gpu.pending()  # its copy up has not run: the host did not wait for it
    second_host = staging.result_buffer(np, GPU, 4, F32)
    assert np.may_share_memory(second_host, first_host) and not gpu.pending()
    second_host[:] = [5, 6, 7, 8]
    second = staging.deliver(second_host, template, GPU, False)
    np.testing.assert_array_equal(to_host(first), [1, 2, 3, 4])
    np.testing.assert_array_equal(to_host(second), [5, 6, 7, 8])


def test_an_in_place_result_goes_up_into_the_array_itself():
    x = on_device(np.zeros((2, 3), np.float32))
    buf, _ = staging.flat_work(x, GPU, False, STAGED)
    buf[:] = np.arange(6)
    assert staging.deliver(buf, x, GPU, True) is x
    np.testing.assert_array_equal(to_host(x), np.arange(6).reshape(2, 3))
    # A strided one through a contiguous copy; and a factor scales it on the host first.
    y = on_device(np.zeros((2, 6), np.float32))
    view = y[:, ::2]
    buf, _ = staging.flat_work(view, GPU, False, STAGED)
    buf[:] = np.arange(6)
    assert staging.deliver(buf, view, GPU, True, factor=0.5) is view
    np.testing.assert_array_equal(to_host(y)[:, ::2], np.arange(6).reshape(2, 3) / 2)
    np.testing.assert_array_equal(to_host(y)[:, 1::2], 0)


def test_each_role_and_dtype_has_its_own_buffer_and_a_grown_one_waits_first():
    f64 = np.dtype(np.float64)
    work = staging.host_scratch(GPU, F32, 8, "work")
    held = [
        work,
        staging.host_scratch(GPU, F32, 8, "result"),
        staging.host_scratch(GPU, f64, 8, "work"),
        staging.host_scratch(GPU, F32, 8),
    ]
    for i, a in enumerate(held):
        for b in held[i + 1 :]:
            assert not np.may_share_memory(a, b)
    work[:] = 3
    staging.deliver(work, on_device(np.zeros(8, np.float32)), GPU, False)
    grown = staging.host_scratch(GPU, F32, 64, "work")  # a new, larger buffer: the old one's
    assert not gpu.pending() and grown.size == 64  # copy up ran before its memory could go back


def test_pinned_buffers_are_per_thread():
    mine = staging.host_scratch(GPU, F32, 4, "work")
    theirs = []
    thread = threading.Thread(
        target=lambda: theirs.append(staging.host_scratch(GPU, F32, 4, "work"))
    )
    thread.start()
    thread.join()
    assert not np.may_share_memory(mine, theirs[0])


@pytest.mark.parametrize("in_place", [False, True])
def test_pieces_move_each_once_its_copy_down_has_run_and_go_up_behind_it(monkeypatch, in_place):
    monkeypatch.setattr(staging, "PIECE_BYTES", 16)  # 4 float32 values a piece
    values = np.arange(11, dtype=np.float32)
    source = on_device(values)
    target = source if in_place else on_device(np.zeros(11, np.float32))
    seen = []

    def move(part):
        # The host has this piece, and only what was queued before its event has run: the
        # copies down of the later pieces wait (they overlap this piece's move on a GPU).
        seen.append((part.copy(), gpu.pending()))
        part *= 2

    staging.through_host_in_pieces(source, target, GPU, move)
    assert [p.tolist() for p, _ in seen] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    # Three copies down queued at once: two still pending while the first piece moves.
    assert seen[0][1] == 2
    # The copies up are queued, not waited for; the next writer of the pinned buffer waits.
    assert gpu.pending()
    staging.host_scratch(GPU, F32, 11)
    assert not gpu.pending()
    np.testing.assert_array_equal(to_host(target), values * 2)
    if not in_place:
        np.testing.assert_array_equal(to_host(source), values)
    assert staging.in_pieces(2 * 16) and not staging.in_pieces(2 * 16 - 1)
