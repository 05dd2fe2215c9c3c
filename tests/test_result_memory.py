"""result_memory: new host arrays from kept blocks, which come back only once nothing views them."""

import gc
import threading

import numpy as np
import pytest
import torch

from horovodlite import result_memory
from horovodlite.result_memory import KEEP_FROM_BYTES, kept_bytes, new_host_array, new_host_like


@pytest.fixture(autouse=True)
def empty_pool(monkeypatch):
    monkeypatch.setattr(result_memory, "_pool", result_memory._Pool())


def address(array) -> int:
    return array.__array_interface__["data"][0]


def test_a_small_array_comes_from_malloc_and_is_never_kept():
    small = new_host_array(KEEP_FROM_BYTES // 8 - 1, np.dtype(np.float64))
    assert small.flags.owndata and small.shape == (KEEP_FROM_BYTES // 8 - 1,)
    del small
    gc.collect()
    assert kept_bytes() == 0


def test_a_block_comes_back_once_every_view_is_gone_and_is_taken_again():
    count = KEEP_FROM_BYTES // 4 + 3  # (not a whole page: blocks are rounded up to pages)
    first = new_host_array(count, np.dtype(np.float32))
    assert first.shape == (count,) and first.dtype == np.float32 and first.flags.writeable
    first[:] = 7.0
    start = address(first)
    # Views of every kind keep the block: a slice, a reshape, another dtype, a torch tensor.
    kept = [first[5:9], first[: count - 3].reshape(-1, 4), first.view(np.int32)]
    kept.append(torch.from_numpy(first))
    del first
    while kept:
        gc.collect()
        assert kept_bytes() == 0, f"the block came back while a {type(kept[0]).__name__} viewed it"
        assert float(kept[-1][0]) == 7.0  # (the torch tensor, the last to go)
        kept.pop(0)
    gc.collect()
    assert kept_bytes() >= count * 4
    again = new_host_array(count - 2, np.dtype(np.float32))  # a smaller size that the block holds
    assert address(again) == start and kept_bytes() == 0


def test_a_block_more_than_twice_the_size_is_not_taken():
    big = new_host_array(4 * KEEP_FROM_BYTES, np.dtype(np.uint8))
    del big
    gc.collect()
    held = kept_bytes()
    small = new_host_array(KEEP_FROM_BYTES, np.dtype(np.uint8))
    assert kept_bytes() == held  # a new block; the big one stays kept
    del small


def test_the_pool_keeps_at_most_its_cap_and_drops_the_oldest_first(monkeypatch):
    monkeypatch.setattr(result_memory, "KEEP_AT_MOST_BYTES", 3 * KEEP_FROM_BYTES)
    arrays = [new_host_array(KEEP_FROM_BYTES, np.dtype(np.uint8)) for _ in range(4)]
    starts = [address(a) for a in arrays]
    while arrays:  # back in the order they were made
        arrays.pop(0)
    gc.collect()
    assert kept_bytes() == 3 * KEEP_FROM_BYTES
    taken = [new_host_array(KEEP_FROM_BYTES, np.dtype(np.uint8)) for _ in range(3)]
    assert sorted(map(address, taken)) == sorted(starts[1:])  # the first back went first


def test_threads_return_and_take_blocks_without_losing_any():
    def churn():
        for _ in range(200):
            a = new_host_array(KEEP_FROM_BYTES // 4, np.dtype(np.float32))
            a[:] = 1.0
            assert a.sum() == a.size
            del a

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gc.collect()
    assert KEEP_FROM_BYTES <= kept_bytes() <= 4 * KEEP_FROM_BYTES


def test_an_array_like_another_takes_its_shape_and_dtype_from_the_pool_where_large():
    small, large = np.ones((3, 4), np.int16), np.ones((KEEP_FROM_BYTES // 8, 2), np.float64)
    for model in (small, large):
        new = new_host_like(model)
        assert new.shape == model.shape and new.dtype == model.dtype and new.flags.c_contiguous
    del new
    gc.collect()
    assert kept_bytes() == large.nbytes  # the large one's block came back; the small one never


def test_release_lets_go_of_the_free_blocks_and_keeps_those_still_viewed():
    dtype = np.dtype(np.float32)
    free, viewed = new_host_array(KEEP_FROM_BYTES, dtype), new_host_array(KEEP_FROM_BYTES, dtype)
    del free
    gc.collect()
    assert kept_bytes() == 4 * KEEP_FROM_BYTES
    result_memory.release()
    assert kept_bytes() == 0
    del viewed
    gc.collect()
    assert kept_bytes() == 4 * KEEP_FROM_BYTES  # it comes back once nothing views it


def test_new_array_takes_the_pool_for_numpy_and_the_module_s_own_empty_otherwise():
    class OtherModule:  # a stand-in for CuPy, whose memory pool keeps GPU memory itself
        @staticmethod
        def empty(count, dtype):
            return ("empty", count, dtype)

    dtype = np.dtype(np.float32)
    host = result_memory.new_array(np, KEEP_FROM_BYTES, dtype)
    assert not host.flags.owndata and host.size == KEEP_FROM_BYTES  # a view of a kept block
    assert result_memory.new_array(OtherModule, 7, dtype) == ("empty", 7, dtype)
