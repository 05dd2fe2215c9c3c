"""Which tensors travel together: one grouped request per dtype, and parameter groups.

The core fuses a grouped request into one buffer, which needs one dtype; gradients of mixed
dtypes therefore go as one grouped request per dtype. Parameter groups (Horovod's `groups=` and
`num_groups=`) decide which gradients a DistributedOptimizer sends as one request.
"""

import operator
from collections.abc import Sequence
from typing import Any, Callable, Optional

__all__ = ["run_per_dtype", "partition"]


def run_per_dtype(
    items: Sequence,
    start: Callable[[list, Optional[str]], Any],
    wait: Callable[[Any], list],
    *,
    dtype_of: Callable[[Any], Any] = operator.attrgetter("dtype"),
) -> list:
    """Run one grouped request per dtype among `items`; return the results in `items`' order.

    Every group's request is started before the first is waited for, so they overlap.

    Args:
        items: arrays or tensors, of any mix of dtypes.
        start: `start(group, suffix)` submits one group's request and returns its handle;
            `suffix` is None when all items share one dtype, else the group's dtype as a str,
            so that a named request can take one name per group.
        wait: `wait(handle)` returns the group's results, in the group's order.
        dtype_of: the dtype of an item (default: its `.dtype`).
    """
    positions: dict = {}
    for i, item in enumerate(items):
        positions.setdefault(dtype_of(item), []).append(i)
    handles = [
        start([items[i] for i in members], None if len(positions) == 1 else str(dtype))
        for dtype, members in positions.items()
    ]
    out: list = [None] * len(items)
    for members, handle in zip(positions.values(), handles):
        for i, result in zip(members, wait(handle)):
            out[i] = result
    return out


def partition(items: list, grouping) -> list:
    """Return `items` as tuples to reduce together.

    Args:
        items: parameters (anything hashable), in the order the groups should follow.
        grouping: None (every item alone), a count n (n groups, dealt round-robin), or explicit
            groups (iterables of items), to which every item they leave out is added alone.
    """
    if grouping is None:
        return [(item,) for item in items]
    if isinstance(grouping, int):
        count = max(1, min(grouping, len(items)))
        return [tuple(items[i::count]) for i in range(count) if items[i::count]]
    listed = [tuple(group) for group in grouping]
    seen = {item for group in listed for item in group}
    return listed + [(item,) for item in items if item not in seen]
