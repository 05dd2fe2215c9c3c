"""A flat buffer whose elements lie in several arrays, for the ring to reduce where they lie.

A fused batch of large in-place arrays need not be copied into one fusion buffer and back out:
the ring can address each of its segments where it lies. It cuts its segments at the pieces'
borders as well as at its chunks', so every message, reduction and division still touches one
contiguous array, and slicing a `Pieces` never needs to join two of them.
"""

import bisect
import itertools

__all__ = ["Pieces", "parts"]


class Pieces:
    """The flat arrays `arrays` (contiguous, one dtype), one after another, as one buffer."""

    def __init__(self, arrays: list):
        self.arrays = arrays
        self.starts = [0, *itertools.accumulate(array.size for array in arrays)]
        self.size = self.starts[-1]
        self.dtype = arrays[0].dtype
        self.nbytes = self.size * self.dtype.itemsize

    @property
    def cuts(self) -> list:
        """The offsets where one piece ends and the next begins."""
        return self.starts[1:-1]

    def __getitem__(self, where: slice):
        """Return elements `where.start` to `where.stop`, which lie in one piece, as its view."""
        lo, hi = where.start, where.stop
        # The last piece starting at or before lo: empty pieces share their start with the next.
        i = min(bisect.bisect_right(self.starts, lo) - 1, len(self.arrays) - 1)
        if hi > self.starts[i + 1]:
            raise IndexError(f"elements {lo}:{hi} lie in more than one piece: cut them first")
        return self.arrays[i][lo - self.starts[i] : hi - self.starts[i]]


def parts(buf) -> list:
    """Return the contiguous arrays that make up `buf` (a `Pieces` or one array)."""
    return buf.arrays if isinstance(buf, Pieces) else [buf]
