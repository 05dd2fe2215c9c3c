"""result_memory: a large result's memory is handed out again only once nothing refers to it."""

import gc
import threading

import numpy as np
import pytest

from horovodlite import result_memory as rm

COUNT = rm.RECYCLED_BYTES // 4  # float32 elements: just large enough to be kept


@pytest.fixture(autouse=True)
def _own_thread_state():
    rm._local.__dict__.clear()
    yield
    rm._local.__dict__.clear()


def _address(array) -> int:
    return array.__array_interface__["data"][0]


def test_a_dropped_result_is_reused():
    first = rm.result_memory(np, np.float32, COUNT)
    where = _address(first)
    del first
    assert _address(rm.result_memory(np, np.float32, COUNT)) == where


@pytest.mark.parametrize(
    "holder",
    [
        lambda a: a,  # the array itself
        lambda a: a[3:7],  # a view of it
        lambda a: a.reshape(-1, 4)[1],  # a view of a view
        lambda a: memoryview(a),
        lambda a: np.frombuffer(a, dtype=np.uint8),
    ],
)
def test_memory_in_use_is_never_handed_out(holder):
    first = rm.result_memory(np, np.float32, COUNT)
    first[:] = 1.0
    kept, where = holder(first), _address(first)
    del first
    gc.collect()
    second = rm.result_memory(np, np.float32, COUNT)
    assert _address(second) != where
    second[:] = 2.0
    assert np.all(np.frombuffer(kept, dtype=np.float32) == 1.0)


def test_a_torch_tensor_sharing_the_memory_keeps_it():
    torch = pytest.importorskip("torch")
    first = rm.result_memory(np, np.float32, COUNT)
    first[:] = 1.0
    tensor, where = torch.from_numpy(first[:10]), _address(first)
    del first
    second = rm.result_memory(np, np.float32, COUNT)
    second[:] = 2.0
    assert _address(second) != where and bool((tensor == 1.0).all())


def test_sizes_dtypes_small_arrays_and_threads_do_not_mix():
    first = rm.result_memory(np, np.float32, COUNT)
    where = _address(first)
    del first
    assert _address(rm.result_memory(np, np.float64, COUNT)) != where  # another dtype
    assert rm.result_memory(np, np.float32, COUNT + 1).size == COUNT + 1  # another size
    small = rm.result_memory(np, np.float32, 16)
    assert small.size == 16 and not any(b is small for b in rm._local.kept)
    other = []
    thread = threading.Thread(target=lambda: other.append(rm.result_memory(np, np.float32, COUNT)))
    thread.start()
    thread.join()
    assert _address(other[0]) != where  # another thread keeps its own
    assert len(rm._local.kept) <= rm._KEPT
