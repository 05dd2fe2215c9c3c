"""The engine's cache of agreed requests: what the ranks agreed on before, the same on every rank.

Once the ranks have agreed on a request by a full exchange of its fields (negotiation.py), the
cache remembers it at a position that is the same on every rank: new keys go last, in the order
the exchange agreed them. In later cycles a repeated request is confirmed by one byte at its
position in the negotiation's message (`offer`, then `ready` on the MIN-reduced bytes) instead
of an exchange of its fields. Horovod's ResponseCache plays this part.

The cache owns the positions, each entry's agreed digest, fields and process set's ranks, and
whether this rank is a member; past LIMIT entries it is cleared, on every rank in the same cycle.
"""

import numpy as np

__all__ = ["AgreedCache", "AgreedEntry"]


class AgreedEntry:
    """One agreed request: its position in the cache, digest, fields and process set's ranks."""

    __slots__ = ("index", "fingerprint", "fields", "ranks", "member")

    def __init__(self, index: int, fingerprint: int, fields: dict, ranks: tuple, member: bool):
        self.index, self.fingerprint, self.fields, self.ranks = index, fingerprint, fields, ranks
        self.member = member  # whether this rank is one of `ranks`


class AgreedCache:
    """The requests the engines agreed on, by key, each at a position the same on every rank."""

    LIMIT = 4096  # entries; past it the cache is cleared (on every rank at once)

    def __init__(self, rank: int):
        self._rank = rank
        self.entries: dict = {}  # key -> AgreedEntry (read it; change it through agreed())
        self._keys: list = []  # position -> key
        self._not_member = bytearray()  # position -> 1 where this rank is not in the set

    def __len__(self) -> int:
        return len(self._keys)

    def clear_if_full(self) -> None:
        """Forget every entry past LIMIT (called where every rank calls it: a full exchange)."""
        if len(self._keys) > self.LIMIT:
            self.entries.clear()
            self._keys.clear()
            self._not_member.clear()

    def agreed(self, key, fingerprint: int, fields: dict, ranks: tuple) -> None:
        """Record that every rank agreed on `key` with these fields (new keys go last)."""
        entry = self.entries.get(key)
        if entry is not None:
            entry.fingerprint, entry.fields = fingerprint, fields
            return
        member = self._rank in ranks
        self.entries[key] = AgreedEntry(len(self._keys), fingerprint, fields, ranks, member)
        self._keys.append(key)
        self._not_member.append(0 if member else 1)

    def offer(self, pending: dict, joined: bool) -> tuple:
        """Return (this rank's byte per position, whether every pending request is cached).

        A byte is 2 where this rank holds the request with the agreed digest, 1 where it has
        nothing to send (it joined, or is not in the process set), 0 where it does not hold it
        yet (or holds it with other fields). Set from `pending` and one copy of the membership
        bytes, with no Python loop over the cache.
        """
        # (Bytes set one by one, then viewed as an array: no index lists for numpy to convert.)
        mine = bytearray(b"\x01" * len(self._keys)) if joined else self._not_member[:]
        uncached = changed = False
        entries = self.entries
        for key, request in pending.items():
            entry = entries.get(key)
            if entry is None:
                uncached = True
            elif request.matches(entry.fields, entry.fingerprint):
                mine[entry.index] = 2
            else:
                mine[entry.index] = 0
                changed = True
        return np.frombuffer(mine, dtype=np.uint8), not (uncached or changed)

    def ready(self, lowest: np.ndarray, highest: np.ndarray) -> list:
        """Return the keys that every member holds: MIN > 0 and MAX 2 at their positions."""
        keys = self._keys
        return [keys[i] for i in np.flatnonzero((lowest > 0) & (highest == 2)).tolist()]
