"""Host memory for new results, kept once the caller lets go of it.

An out-of-place result needs memory of its own, and fresh memory is slow memory: glibc's malloc
maps an allocation above its threshold (128 KiB at first, and an allocation of the very size
just freed is mapped again) straight from the kernel, which zeroes each page at its first
touch. A training loop that all-reduces the same arrays every step paid that for every result:
a fused batch of 200 results of 4 KiB took 0.70 ms, and 0.27 ms with glibc told to keep freed
memory (docs/engine.md, "Stop 48: the repeated request").

So a large result gets a block from a pool instead. Its arrays are views of one memoryview,
which every view keeps alive; once the last of them is gone the block returns to the pool, and
the next result of a size it can hold takes it, its pages already mapped. Small results come
from malloc, which reuses freed memory of their size itself. hvd.shutdown() lets go of the pool.
"""

import bisect
import threading
import weakref

import numpy as np

__all__ = [
    "new_host_array",
    "new_host_like",
    "new_array",
    "kept_bytes",
    "release",
    "KEEP_FROM_BYTES",
    "KEEP_AT_MOST_BYTES",
]

KEEP_FROM_BYTES = 128 << 10  # smaller results come from malloc, which reuses its memory (below
# glibc's first mmap threshold): a pool costs them more than it saves
KEEP_AT_MOST_BYTES = 512 << 20  # the most the pool keeps; past it, the oldest blocks go
_ROUND_BYTES = 4 << 10  # block sizes are whole pages, so that near sizes share blocks


class _Pool:
    """Free blocks (uint8 arrays), sorted by size, each with the order it came back in."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free: list = []  # (size, when it came back, block), sorted
        self._returned = 0  # blocks come back one after another: this counts them
        self.bytes = 0

    def take(self, nbytes: int) -> np.ndarray:
        """Return a free block of `nbytes` to twice that, or a new one of `nbytes`."""
        with self._lock:
            i = bisect.bisect_left(self._free, (nbytes,))
            if i < len(self._free) and self._free[i][0] <= 2 * nbytes:
                size, _, block = self._free.pop(i)
                self.bytes -= size
                return block
        return np.empty(nbytes, dtype=np.uint8)

    def clear(self) -> None:
        """Let go of every free block."""
        with self._lock:
            self._free.clear()
            self.bytes = 0

    def give_back(self, block: np.ndarray) -> None:
        """Keep `block` for a later result; drop the oldest blocks past KEEP_AT_MOST_BYTES."""
        size = block.nbytes
        if size > KEEP_AT_MOST_BYTES:
            return
        with self._lock:
            while self.bytes + size > KEEP_AT_MOST_BYTES:
                oldest = min(range(len(self._free)), key=lambda i: self._free[i][1])
                self.bytes -= self._free.pop(oldest)[0]
            bisect.insort(self._free, (size, self._returned, block))
            self._returned += 1
            self.bytes += size


_pool = _Pool()


class _Viewed(weakref.ref):
    """A weak reference to the memoryview that a result's arrays keep alive, with its block."""

    __slots__ = ("block",)


_viewed: dict = {}  # id -> _Viewed, for the blocks out with results now


def _came_back(viewed: _Viewed) -> None:
    _viewed.pop(id(viewed), None)
    _pool.give_back(viewed.block)


def new_host_array(count: int, dtype: np.dtype) -> np.ndarray:
    """Return a new flat numpy array of `count` elements of `dtype` (a numpy dtype; the array
    uninitialized), from the pool where it is large."""
    nbytes = count * dtype.itemsize
    if nbytes < KEEP_FROM_BYTES:
        return np.empty(count, dtype=dtype)
    block = _pool.take(-(-nbytes // _ROUND_BYTES) * _ROUND_BYTES)
    array = np.frombuffer(block.data, dtype=dtype, count=count)
    # `array.base` is a memoryview that every view of the result keeps alive, however it is
    # sliced, reshaped or handed on (torch.from_numpy, DLPack): when it goes, nothing reads the
    # block any more. (A weak reference of our own costs half of weakref.finalize's.)
    viewed = _Viewed(array.base, _came_back)
    viewed.block = block
    _viewed[id(viewed)] = viewed
    return array


def new_array(xp, count: int, dtype: np.dtype):
    """Return a new flat array of module `xp` for a result: numpy's as new_host_array(), any
    other module's (CuPy, with its own memory pool) from `xp.empty`."""
    return new_host_array(count, dtype) if xp is np else xp.empty(count, dtype=dtype)


def new_host_like(array: np.ndarray) -> np.ndarray:
    """Return a new C-ordered array of `array`'s shape and dtype, as new_host_array()."""
    if array.nbytes < KEEP_FROM_BYTES:
        return np.empty(array.shape, dtype=array.dtype)
    return new_host_array(array.size, array.dtype).reshape(array.shape)


def release() -> None:
    """Hand the kept blocks back to the allocator (hvd.shutdown() does); blocks still viewed by
    results are kept again once those are gone."""
    _pool.clear()


def kept_bytes() -> int:
    """Return how many bytes the pool keeps now."""
    return _pool.bytes
