"""Memory for large results that leave the library: reused once nothing else refers to it.

An out-of-place all-reduce or allgather returns new arrays (views of one buffer for a fused
batch). A training step makes the same large results step after step and drops last step's, so
the allocator hands back memory of the same size; but glibc returns large blocks to the system
(always above 32 MiB, and below it on threads whose heap it trims, such as TensorFlow's), and
every page of a new block faults on first touch. Measured: a 64 MiB grouped all-reduce at 2 ranks
spent 3 of its 20 ms on the main thread, and a train step's 4.8 MB of gradients inside a
`tf.function` 0.3 of 2.6 ms, in those faults (docs/benchmarks.md).

`result_memory` keeps, per thread, the last few large buffers it handed out, and hands one out
again only when nothing but itself refers to it: every numpy view of a buffer holds a reference
to it, and so does every consumer that shares numpy memory (a torch tensor from torch.from_numpy,
a TensorFlow tensor that did not copy, a memoryview), so a buffer whose results are still in use
is never reused. Host (numpy) memory only: CuPy keeps its own memory pool.
"""

import sys
import threading

import numpy as np

__all__ = ["result_memory", "RECYCLED_BYTES"]

# Below this a new block is cheap (and glibc reuses it anyway): only larger results are kept.
RECYCLED_BYTES = 1 << 20
_KEPT = 4  # buffers kept per thread, the most recently handed out

_local = threading.local()


def result_memory(xp, dtype, count: int):
    """Return a new 1-D array of `count` elements of `dtype` for results of module `xp`.

    Large host arrays may be earlier results' memory that nobody refers to any more; their
    contents are undefined, as np.empty's.
    """
    dtype = np.dtype(dtype)
    if xp is not np or count * dtype.itemsize < RECYCLED_BYTES:
        return xp.empty(count, dtype=dtype)
    kept = getattr(_local, "kept", None)
    if kept is None:
        kept = _local.kept = []
    for i in range(len(kept)):
        buffer = kept[i]
        # References: the list, `buffer`, getrefcount's argument; any more are results in use.
        if buffer.size == count and buffer.dtype == dtype and sys.getrefcount(buffer) == 3:
            kept.append(kept.pop(i))  # the most recently handed out goes last
            return buffer
    buffer = np.empty(count, dtype=dtype)
    kept.append(buffer)
    if len(kept) > _KEPT:
        del kept[0]
    return buffer
