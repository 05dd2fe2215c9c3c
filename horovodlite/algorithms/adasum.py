"""Adasum all-reduce: adaptive summation over pairs of ranks (Maleki et al., MLSys 2021).

Two vectors a and b combine as

    a + b - (a.b / 2|a|^2) a - (a.b / 2|b|^2) b

which is their sum when they are orthogonal and their average when they are equal. Over 2^k
ranks the pairs form a tree, as in Horovod's MPI Adasum: at distance d = 1, 2, 4, ... rank r
pairs with r ^ d, and the groups of d ranks on either side combine their vectors.

The data moves as a recursive vector-halving, distance-doubling reduce-scatter, then the
reverse all-gather: at each level a rank keeps half of its slice, sends the other half to its
partner and combines the half it kept. A rank sends 2(n-1)/n of the buffer in all, as in the
ring. Its slice is only part of the two groups' vectors, so the three partial sums (a.b, |a|^2,
|b|^2) are summed over the 2d ranks that hold them, by recursive doubling of a few doubles.

Dot products and norms are accumulated in float64; float16 and bfloat16 are combined in
float32. A buffer may hold several tensors (`parts`): each gets its own dot products, as
Horovod treats each tensor of a fused buffer separately. Every element's final value is
computed by one rank and then copied, so all ranks end with the same bits.
"""

import bisect

import ml_dtypes
import numpy as np

from ..buffers import synchronize_device, wire_type
from .scratch import scratch

__all__ = ["ADASUM_DTYPES", "adasum_allreduce", "adasum_pair", "is_power_of_two"]

# Adasum combines vectors by their angle: it needs floating point.
ADASUM_DTYPES = frozenset(
    np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)
)

_TAG_HALVE = 31
_TAG_DOTS = 32
_TAG_GATHER = 33


def is_power_of_two(n: int) -> bool:
    """Return whether `n` is 1, 2, 4, 8, ..."""
    return n > 0 and n & (n - 1) == 0


def adasum_pair(dot: float, anormsq: float, bnormsq: float) -> tuple:
    """Return the coefficients (of a, of b) that combine a and b, from a.b, |a|^2 and |b|^2.

    A zero vector keeps coefficient 1 (its term is zero anyway): no division by zero. Horovod
    also treats |a|^2 < 1e-8 as zero; computed in float64 that is not needed, so small
    gradients are still combined by their angle.
    """
    acoeff = 1.0 - dot / (2.0 * anormsq) if anormsq > 0.0 else 1.0
    bcoeff = 1.0 - dot / (2.0 * bnormsq) if bnormsq > 0.0 else 1.0
    return acoeff, bcoeff


def _partial_dots(xp, a, b, lo: int, parts: tuple, starts: list) -> np.ndarray:
    """Return (a.b, |a|^2, |b|^2) of each tensor in `parts` over the slice at offset `lo`."""
    dots = np.zeros((len(parts), 3))
    hi = lo + a.size
    first = max(bisect.bisect_right(starts, lo) - 1, 0)
    for t in range(first, len(parts)):
        start, stop = parts[t]
        if start >= hi:
            break
        s, e = max(start, lo) - lo, min(stop, hi) - lo
        if e <= s:
            continue
        x, y = a[s:e].astype(xp.float64), b[s:e].astype(xp.float64)
        dots[t] = float(xp.dot(x, y)), float(xp.dot(x, x)), float(xp.dot(y, y))
    return dots


def _group_sum(comm, values: np.ndarray, group: int) -> np.ndarray:
    """Return the sum of `values` over the `group` ranks r with equal r // group (a power of 2).

    Recursive doubling: both partners of a step add the same two operands, lower rank first, so
    every rank of the group ends with the same bits.
    """
    r = comm.rank
    total, other = values, np.empty_like(values)
    distance = 1
    while distance < group:
        partner = r ^ distance
        comm.Sendrecv(total, partner, _TAG_DOTS, other, partner, _TAG_DOTS)
        total = other + total if r & distance else total + other
        distance *= 2
    return total


def _combine(xp, mine, theirs, own: float, their: float) -> None:
    """Set `mine` to own * mine + their * theirs in place."""
    if mine.dtype.itemsize < 4:  # float16, bfloat16: combine in float32, round once
        work = mine.astype(xp.float32)
        work *= own
        work += theirs.astype(xp.float32) * their
        mine[...] = work.astype(mine.dtype)
    else:
        mine *= own
        mine += theirs * their


def adasum_allreduce(comm, buf, op=None, xp=np, segment_bytes: int = 0, parts=None) -> None:
    """All-reduce the flat contiguous float `buf` in place with Adasum.

    Args:
        comm: a communicator whose size is a power of two.
        buf: the flat buffer, float16, bfloat16, float32 or float64.
        op: ignored (the common signature of `algorithms`); Adasum is its own op.
        xp: the array module of `buf` (numpy or cupy).
        segment_bytes: ignored: each half travels whole.
        parts: (start, stop) offsets of the tensors fused in `buf`, each combined with its own
            dot products; default one tensor, the whole buffer.

    Raises:
        ValueError: the communicator's size is not a power of two (checks.py refuses this
            before any communication; this guards direct use).
    """
    n, r = comm.size, comm.rank
    if not is_power_of_two(n):
        raise ValueError(f"Adasum needs a power-of-two number of ranks, got {n}")
    if n == 1 or buf.size == 0:
        return
    parts = ((0, buf.size),) if parts is None else tuple(parts)
    starts = [start for start, _ in parts]
    wire = wire_type(buf.dtype)
    incoming = scratch(xp, buf.dtype, (buf.size + 1) // 2, slot=_TAG_HALVE)
    lo, hi = 0, buf.size
    levels = []  # (lo, hi) before each halving, to undo them in reverse
    distance = 1
    while distance < n:
        partner, upper = r ^ distance, bool(r & distance)
        mid = lo + (hi - lo) // 2
        keep, give = ((mid, hi), (lo, mid)) if upper else ((lo, mid), (mid, hi))
        mine, theirs = buf[keep[0] : keep[1]], incoming[: keep[1] - keep[0]]
        comm.Sendrecv(
            [buf[give[0] : give[1]], wire], partner, _TAG_HALVE, [theirs, wire], partner, _TAG_HALVE
        )
        # a is the lower group's vector and b the upper one's, on every rank of the pair.
        a, b = (theirs, mine) if upper else (mine, theirs)
        dots = _group_sum(comm, _partial_dots(xp, a, b, keep[0], parts, starts), 2 * distance)
        for t in range(max(bisect.bisect_right(starts, keep[0]) - 1, 0), len(parts)):
            start, stop = parts[t]
            if start >= keep[1]:
                break
            s, e = max(start, keep[0]), min(stop, keep[1])
            if e <= s:
                continue
            acoeff, bcoeff = adasum_pair(*dots[t])
            own, their = (bcoeff, acoeff) if upper else (acoeff, bcoeff)
            _combine(xp, buf[s:e], theirs[s - keep[0] : e - keep[0]], own, their)
        levels.append((lo, hi))
        lo, hi = keep
        distance *= 2
    synchronize_device(xp)  # the GPU's combining is done before MPI reads the buffer
    for level_lo, level_hi in reversed(levels):
        distance //= 2
        partner, upper = r ^ distance, bool(r & distance)
        mid = level_lo + (level_hi - level_lo) // 2
        other = (level_lo, mid) if upper else (mid, level_hi)
        comm.Sendrecv(
            [buf[lo:hi], wire],
            partner,
            _TAG_GATHER,
            [buf[other[0] : other[1]], wire],
            partner,
            _TAG_GATHER,
        )
        lo, hi = level_lo, level_hi
