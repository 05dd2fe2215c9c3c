"""Host memory for new results, kept once the caller lets go of it.

An out-of-place result needs memory of its own, and fresh memory is slow memory: glibc's malloc
maps an allocation above its threshold (128 KiB at first, and an allocation of the very size
just freed is mapped again) straight from the kernel, which zeroes each page at its first
touch. A training loop that all-reduces the same arrays every step paid that for every result:
200 fused results of 4 KiB took about 430 µs more than the reduction itself, twice MPI's own
all-reduce of the same bytes (docs/benchmarks.md, "The engine's cost per request").

So a large result gets a block from a pool instead. Its arrays are views of one memoryview,
which every view keeps alive; once the last of them is gone the block returns to the pool, and
the next result of a size it can hold takes it, its pages already mapped. Small results come
from malloc, which reuses freed memory of their size itself.
"""

import bisect
import threading
import weakref

import numpy as np

__all__ = ["new_host_array", "kept_bytes", "KEEP_FROM_BYTES", "KEEP_AT_MOST_BYTES"]

KEEP_FROM_BYTES = 64 << 10  # smaller results come from malloc as they are
KEEP_AT_MOST_BYTES = 512 << 20  # the most the pool keeps; past it, the oldest blocks go
_ROUND_BYTES = 4 << 10  # block sizes are whole pages, so that near sizes share blocks


class _Pool:
    """Free blocks (uint8 arrays), by size, with the order they came back in."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sizes: list = []  # sorted sizes of the free blocks
        self._blocks: list = []  # the blocks, in the order of `_sizes`
        self._returned = 0  # a counter: which block came back first
        self._ages: list = []  # per block, when it came back
        self.bytes = 0

    def take(self, nbytes: int) -> np.ndarray:
        """Return a free block of `nbytes` to twice that, or a new one of `nbytes`."""
        with self._lock:
            i = bisect.bisect_left(self._sizes, nbytes)
            if i < len(self._sizes) and self._sizes[i] <= 2 * nbytes:
                self.bytes -= self._sizes.pop(i)
                self._ages.pop(i)
                return self._blocks.pop(i)
        return np.empty(nbytes, dtype=np.uint8)

    def give_back(self, block: np.ndarray) -> None:
        """Keep `block` for a later result; drop the oldest blocks past KEEP_AT_MOST_BYTES."""
        with self._lock:
            if block.nbytes > KEEP_AT_MOST_BYTES:
                return
            while self.bytes + block.nbytes > KEEP_AT_MOST_BYTES:
                oldest = self._ages.index(min(self._ages))
                self.bytes -= self._sizes.pop(oldest)
                self._blocks.pop(oldest)
                self._ages.pop(oldest)
            i = bisect.bisect_left(self._sizes, block.nbytes)
            self._sizes.insert(i, block.nbytes)
            self._blocks.insert(i, block)
            self._ages.insert(i, self._returned)
            self._returned += 1
            self.bytes += block.nbytes


_pool = _Pool()


def new_host_array(count: int, dtype) -> np.ndarray:
    """Return a new flat numpy array of `count` elements of `dtype` (uninitialized), from the
    pool where it is large."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    if nbytes < KEEP_FROM_BYTES:
        return np.empty(count, dtype=dtype)
    block = _pool.take(-(-nbytes // _ROUND_BYTES) * _ROUND_BYTES)
    array = np.frombuffer(block.data, dtype=dtype, count=count)
    # `array.base` is a memoryview that every view of the result keeps alive, however it is
    # sliced, reshaped or handed on (torch.from_numpy, DLPack): when it goes, nothing reads the
    # block any more.
    weakref.finalize(array.base, _pool.give_back, block).atexit = False
    return array


def kept_bytes() -> int:
    """Return how many bytes the pool keeps now."""
    return _pool.bytes
