"""Elastic pieces that need no MPI job: the commit files and the dealing of sample indices."""

import os
import types

import pytest

from horovodlite.training import elastic_sampling
from horovodlite.training.commit_store import CommitStore


def test_commits_are_written_whole_and_the_last_two_kept(tmp_path):
    store = CommitStore(str(tmp_path / "rank-0"))
    for number in range(1, 5):
        store.write(number, f"payload {number}".encode())
    assert store.numbers() == [4, 3]
    assert store.newest() == (4, b"payload 4")
    assert sorted(os.listdir(store.folder)) == [
        "commit-000000000003.bin",
        "commit-000000000004.bin",
    ]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage"])
def test_a_damaged_commit_is_skipped_for_the_one_before(tmp_path, damage):
    store = CommitStore(str(tmp_path))
    store.write(1, b"first")
    path = store.write(2, b"second commit")
    data = open(path, "rb").read()
    damaged = {
        "truncate": data[:-2],
        "flip": data[:-1] + bytes([data[-1] ^ 1]),
        "empty": b"",
        "garbage": b"not a commit at all, but long enough to hold a header" * 2,
    }[damage]
    with open(path, "wb") as f:
        f.write(damaged)
    assert store.read(2) is None
    with pytest.warns(RuntimeWarning, match="commit-000000000002.bin is incomplete"):
        assert store.newest() == (1, b"first")


def test_a_temporary_file_is_never_read_and_is_cleaned_up(tmp_path):
    store = CommitStore(str(tmp_path))
    store.write(1, b"one")
    leftover = store.path(2) + ".tmp-99"
    open(leftover, "wb").write(b"half")
    assert store.newest() == (1, b"one")
    store.write(2, b"two")
    assert not os.path.exists(leftover) and store.newest() == (2, b"two")


def test_an_empty_store_has_no_commit(tmp_path):
    assert CommitStore(str(tmp_path / "missing")).newest() == (-1, None)


def _ranks(monkeypatch, size: int, length: int, processed=None, epoch=0, **options) -> list:
    """Return one ElasticIndices per rank of a simulated job of `size` ranks."""
    samplers = []
    for rank in range(size):
        fake = types.SimpleNamespace(size=lambda s=size: s, rank=lambda r=rank: r)
        monkeypatch.setattr(elastic_sampling, "_state", fake)
        sampler = elastic_sampling.ElasticIndices(length, **options)
        if processed is not None:
            sampler.load_state_dict({"epoch": epoch, "processed_indices": processed})
        samplers.append(sampler)
    return samplers


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_resize_from_3_to_2_ranks_processes_every_sample_once(monkeypatch, shuffle):
    length, batch = 30, 2
    seen = []
    old = _ranks(monkeypatch, 3, length, shuffle=shuffle, seed=7)
    for b in range(2):  # two batches on 3 ranks, then a commit
        for sampler in old:
            seen += sampler.get_indices(b, batch)
        for sampler in old:
            sampler.record_batch(b, batch)
    states = [s.state_dict() for s in old]
    assert all(s == states[0] for s in states) and len(states[0]["processed_indices"]) == 12
    new = _ranks(monkeypatch, 2, length, states[0]["processed_indices"], shuffle=shuffle, seed=7)
    assert len(new[0]) == len(new[1]) == 9
    for b in range(-(-9 // batch)):
        for sampler in new:
            seen += sampler.get_indices(b, batch)
    assert sorted(seen) == list(range(length))
    # The remaining indices keep the epoch's order.
    order = [i for s in old for i in s.indices]
    assert set(order) == set(range(length))


def test_the_next_epoch_starts_over_and_the_same_epoch_keeps_its_position(monkeypatch):
    (sampler,) = _ranks(monkeypatch, 1, 10, list(range(4)), shuffle=False)
    sampler.set_epoch(0)
    assert list(sampler) == list(range(4, 10))
    sampler.set_epoch(1)
    assert list(sampler) == list(range(10)) and sampler.processed_indices == set()


def test_shuffled_orders_agree_across_ranks_and_change_per_epoch(monkeypatch):
    a, b = _ranks(monkeypatch, 2, 40, seed=3)
    assert a._dealt.tolist() == b._dealt.tolist()
    first = a._dealt.tolist()
    a.set_epoch(1)
    assert a._dealt.tolist() != first and sorted(a._dealt.tolist()) == list(range(40))


def test_uneven_remainders_repeat_fewer_than_size_indices(monkeypatch):
    samplers = _ranks(monkeypatch, 3, 10, [0, 1, 2, 3, 4, 5, 6, 7, 8], shuffle=False)
    assert [list(s) for s in samplers] == [[9], [9], [9]]
    with pytest.raises(ValueError, match="cannot have -1 samples"):
        _ranks(monkeypatch, 1, -1)
