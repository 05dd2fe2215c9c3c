"""How ZeRO shards parameters over ranks: buckets of parameters, each split evenly by elements.

Parameters (flattened, in the order given) fill buckets of at most `cap_bytes`, one dtype and
device per bucket. A bucket is reduced as one flat buffer, and rank r owns the r-th chunk of it
(the reduce-scatter split: the first `numel % n` ranks get one element more), so every rank owns
within one element per bucket of 1/n of the model, whatever the parameter sizes. A rank's chunk
of a bucket is cut into pieces, one per parameter it overlaps. Framework-neutral: sizes in,
index ranges out.
"""

from __future__ import annotations

import dataclasses

from ..algorithms.scratch import chunk_bounds

__all__ = ["Bucket", "Piece", "plan_buckets"]


@dataclasses.dataclass(frozen=True)
class Piece:
    """The elements [start, stop) of parameter `param` (flattened) that one rank owns.

    `offset` is where they start within that rank's chunk of the bucket.
    """

    param: int
    start: int
    stop: int
    offset: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Parameters reduced as one flat buffer: where each one starts, and each rank's chunk."""

    params: tuple  # parameter indices, in the order of the flat buffer
    offsets: tuple  # where each parameter starts in the flat buffer
    numel: int
    bounds: tuple  # (lo, hi) of each rank's chunk

    def pieces(self, rank: int, sizes: list) -> list:
        """Return the pieces of `rank`'s chunk; `sizes` are the element counts of all params."""
        lo, hi = self.bounds[rank]
        pieces = []
        for param, offset in zip(self.params, self.offsets):
            start, stop = max(offset, lo), min(offset + sizes[param], hi)
            if start < stop:
                pieces.append(Piece(param, start - offset, stop - offset, start - lo))
        return pieces


def plan_buckets(sizes: list, kinds: list, itemsizes: list, cap_bytes: int, ranks: int) -> list:
    """Return the buckets of parameters with element counts `sizes`, in list order.

    `kinds[i]` (dtype and device, say) must be the same within a bucket; a bucket closes when
    the next parameter is of another kind or would take it past `cap_bytes` (a parameter larger
    than that gets a bucket of its own).
    """
    buckets, current, offsets, numel, nbytes = [], [], [], 0, 0

    def close():
        if current:
            buckets.append(Bucket(tuple(current), tuple(offsets), numel,
                                  chunk_bounds(numel, ranks)))  # fmt: skip

    for index, (size, kind, itemsize) in enumerate(zip(sizes, kinds, itemsizes)):
        if current and (kind != kinds[current[-1]] or nbytes + size * itemsize > cap_bytes):
            close()
            current, offsets, numel, nbytes = [], [], 0, 0
        current.append(index)
        offsets.append(numel)
        numel += size
        nbytes += size * itemsize
    close()
    return buckets
