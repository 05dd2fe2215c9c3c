"""Which samples each rank reads in an elastic job, so a resize neither skips nor repeats any.

`ElasticIndices` orders an epoch's indices the same way on every rank (a permutation seeded by
`seed + epoch`), leaves out those already processed this epoch, and deals the rest out to the
ranks of the current size: rank r takes every n-th index from position r. The processed set
is part of every commit, so a job restarted at another size deals out exactly what is left.
`ElasticSampler` is Horovod's sampler over a dataset (torch's is also a torch Sampler, JAX's is
it as it is); `SamplerHandler` commits it.
"""

import math

import numpy as np

from .. import collectives
from .. import state as _state
from .elastic import StateHandler

__all__ = ["ElasticIndices", "ElasticSampler", "SamplerHandler"]


class ElasticIndices:
    """This rank's share of one epoch's unprocessed indices of a dataset of `length` samples.

    Args:
        length: the number of samples.
        shuffle: deal the indices out in a permutation seeded by `seed + epoch`, the same on
            every rank (and in every restart); otherwise in order.
        seed: the permutation's base seed.
    """

    def __init__(self, length: int, shuffle: bool = True, seed: int = 0):
        if length < 0:
            raise ValueError(f"a dataset cannot have {length} samples")
        self.length, self.shuffle, self.seed = int(length), bool(shuffle), int(seed)
        self.epoch = 0
        self.processed_indices: set = set()
        self._unshared: set = set()  # recorded by record_indices and not yet gathered
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`; a new epoch forgets the processed indices, the same one keeps them.

        Keeping them lets a resumed loop call `set_epoch(state.epoch)` for the epoch it resumes
        without dealing out again what the commit says was done.
        """
        if epoch != self.epoch:
            self.processed_indices = set()
            self._unshared = set()
        self.epoch = int(epoch)
        self.reset()

    def reset(self) -> None:
        """Deal the unprocessed indices out to the current ranks (after a restore or a resize)."""
        self.num_replicas, self.rank = _state.size(), _state.rank()
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(self.length)
        else:
            order = np.arange(self.length)
        if self.processed_indices:
            done = np.fromiter(self.processed_indices, dtype=np.int64)
            order = order[~np.isin(order, done)]
        self.remaining = len(order)
        self.num_samples = math.ceil(self.remaining / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        # Every rank must run as many batches: the short ranks repeat indices from the start
        # (at most num_replicas - 1 repeats, the same rule as torch's DistributedSampler).
        self._dealt = np.resize(order, self.total_size) if self.remaining else order
        self.indices = self._dealt[self.rank :: self.num_replicas].tolist()

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        return iter(self.indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list:
        """Return this rank's indices of batch `batch_idx` of size `batch_size` this epoch."""
        start = batch_idx * batch_size
        return self.indices[start : start + batch_size]

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark batch `batch_idx` done on every rank (each rank computes the others' shares)."""
        start, stop = batch_idx * batch_size, (batch_idx + 1) * batch_size
        for rank in range(self.num_replicas):
            share = self._dealt[rank :: self.num_replicas][start:stop]
            self.processed_indices.update(share.tolist())

    def record_indices(self, indices) -> None:
        """Mark `indices` done by this rank; the next commit or sync gathers every rank's."""
        indices = {int(i) for i in indices}
        self.processed_indices |= indices
        self._unshared |= indices

    def state_dict(self) -> dict:
        """Return the epoch and its processed indices (sorted), picklable."""
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take the epoch and processed indices of `state_dict`, and deal out the rest anew."""
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = set(state_dict["processed_indices"])
        self._unshared = set()
        self.reset()

    def gather_processed(self) -> None:
        """Add the indices that other ranks recorded with record_indices (collective)."""
        gathered = collectives.allgather_object(
            sorted(self._unshared), name="elastic.sampler.processed"
        )
        for indices in gathered:
            self.processed_indices.update(indices)
        self._unshared = set()


class ElasticSampler(ElasticIndices):
    """Horovod's ElasticSampler: each epoch's samples once, across restarts and resizes.

    Iterate it (or call `get_indices(batch_idx, batch_size)`) for this rank's indices; record
    what was processed with `record_batch(batch_idx, batch_size)` (the batch on every rank) or
    `record_indices(indices)` (this rank's); a commit keeps the set, and a restart at any size
    deals out only the rest of the epoch. `set_epoch(e)` starts epoch `e` (calling it again with
    the epoch in progress keeps the position). Put it in the binding's elastic state to commit it.

    Args:
        dataset: anything with `len()`.
        shuffle: a new permutation each epoch, the same on every rank, seeded by `seed + epoch`.
        seed: the permutation's base seed.
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        super().__init__(len(dataset), shuffle=shuffle, seed=seed)


class SamplerHandler(StateHandler):
    """Commits an ElasticIndices (or a sampler built on it) as its state dict.

    `save()` is collective: it gathers the indices ranks recorded one by one, so every rank
    commits the same processed set. Taking a sampler (at construction, or by assignment to the
    state) commits what this rank holds, without communication.
    """

    def __init__(self, value):  # no collective inside a state's constructor
        self.value, self.saved = value, value.state_dict()

    def set_value(self, value) -> None:
        self.value, self.saved = value, value.state_dict()

    def save(self) -> None:
        self.value.gather_processed()
        self.saved = self.value.state_dict()

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        self.value.gather_processed()
        self.value.load_state_dict(
            collectives.broadcast_object(self.value.state_dict(), 0, name="elastic.sampler")
        )
