"""Which server holds which rows of which parameter.

Every parameter is cut along its first dimension only, so a server's piece of a weight matrix is
itself a matrix (an optimizer that looks at a tensor's shape, such as Adafactor, sees rows of the
original) and a piece of an embedding is a range of its rows. Big dense parameters and every
sparse (embedding) parameter are split evenly over all servers; small dense ones are packed
whole onto the least loaded server, largest first, so each server holds about the same number of
elements and a model of many small tensors costs few pieces.
"""

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

__all__ = ["Piece", "plan_shards", "owner_of_rows", "SPLIT_ELEMENTS"]

# A dense parameter at least this large is split over the servers instead of packed whole: below
# it, one more message piece costs more than the imbalance it saves.
SPLIT_ELEMENTS = 1 << 16


class Piece(NamedTuple):
    """Rows [start, stop) of parameter `index`, held by one server."""

    index: int
    start: int
    stop: int
    sparse: bool


def _even_rows(rows: int, parts: int) -> list:
    """Return `parts` + 1 bounds cutting `rows` rows as evenly as possible."""
    return [rows * k // parts for k in range(parts + 1)]


def plan_shards(
    shapes: Sequence[tuple],
    sparse: Sequence[bool],
    servers: int,
    split_elements: int = SPLIT_ELEMENTS,
) -> list:
    """Return, for each server, the list of its Pieces (in parameter order).

    Args:
        shapes: each parameter's shape.
        sparse: whether each parameter is an embedding updated by rows.
        servers: the number of servers.
        split_elements: dense parameters with at least this many elements (and at least as many
            rows as servers) are split; smaller ones are packed whole.
    """
    if servers < 1:
        raise ValueError(f"expected at least one server, got {servers}")
    pieces: list = [[] for _ in range(servers)]
    load = [0] * servers
    whole = []
    for index, (shape, is_sparse) in enumerate(zip(shapes, sparse)):
        numel = 1
        for n in shape:
            numel *= n
        rows = shape[0] if shape else 1
        if shape and rows and (is_sparse or (numel >= split_elements and rows >= servers)):
            bounds = _even_rows(rows, servers)
            for server in range(servers):
                if bounds[server] < bounds[server + 1] or is_sparse:
                    pieces[server].append(
                        Piece(index, bounds[server], bounds[server + 1], is_sparse)
                    )
                    load[server] += (bounds[server + 1] - bounds[server]) * (numel // max(rows, 1))
        else:
            whole.append((numel, index, rows))
    # Largest first onto the least loaded server (ties: the lowest server), the same on every rank.
    for numel, index, rows in sorted(whole, key=lambda w: (-w[0], w[1])):
        server = min(range(servers), key=lambda s: (load[s], s))
        pieces[server].append(Piece(index, 0, rows, False))
        load[server] += numel
    return [sorted(p, key=lambda piece: piece.index) for p in pieces]


def owner_of_rows(bounds: Sequence[int], rows):
    """Return, for each row of `rows` (a numpy int array), the server whose range holds it.

    `bounds` are the servers' row bounds of one sparse parameter (servers + 1 numbers).
    """
    return np.searchsorted(np.asarray(bounds[1:-1]), rows, side="right")
