"""Per-thread scratch buffers and chunk layouts, reused across calls instead of reallocated."""

import functools
import threading

__all__ = ["scratch", "chunk_bounds"]

_local = threading.local()


def scratch(xp, dtype, count: int, slot: int = 0):
    """Return a reusable 1-D buffer of at least `count` elements; one set per thread.

    `slot` tells apart buffers that one algorithm needs at the same time.
    """
    cache = getattr(_local, "buffers", None)
    if cache is None:
        cache = _local.buffers = {}
    key = (xp.__name__, dtype.str, dtype.name, slot)
    buf = cache.get(key)
    if buf is None or buf.size < count:
        buf = cache[key] = xp.empty(max(count, 1), dtype=dtype)
    return buf[:count]


@functools.lru_cache(maxsize=1024)
def chunk_bounds(count: int, parts: int) -> tuple:
    """Split `count` elements into `parts` contiguous chunks; the first `count % parts` are longer.

    Returns a tuple of (start, stop) pairs.
    """
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)
