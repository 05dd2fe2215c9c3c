"""The elastic state on every rank: commit, restore, sync, durable commits, host updates."""

import dataclasses
import os
import shutil
import tempfile

import horovodlite.torch as hvd
import numpy as np
import pytest
import torch
from oracle import WORLD

from horovodlite import state as core_state
from horovodlite.training import elastic
from horovodlite.training.commit_store import CommitStore, commit_folder


@pytest.fixture
def settings(monkeypatch):
    """Return a function that sets elastic settings on this rank for the test's duration."""
    current = core_state.current()

    def change(**fields):
        monkeypatch.setattr(current, "settings", dataclasses.replace(current.settings, **fields))

    return change


@pytest.fixture
def shared_dir():
    """A temporary folder made by rank 0, the same path on every rank."""
    path = WORLD.bcast(tempfile.mkdtemp(prefix="hvdl-elastic-") if WORLD.rank == 0 else None)
    yield path
    WORLD.Barrier()
    if WORLD.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def durable(settings, shared_dir):
    job = "job"
    settings(elastic_job_id=job, elastic_dir=shared_dir)
    return lambda rank: CommitStore(commit_folder(shared_dir, job, rank))


def test_object_state_commit_restore_sync():
    state = hvd.elastic.ObjectState(epoch=hvd.rank(), items=[hvd.rank()])
    state.sync()  # rank 0's committed values everywhere
    assert (state.epoch, state.items) == (0, [0])
    state.epoch, state.items = 5, state.items + [7]
    state.commit()
    assert state.commit_number == 1
    state.items.append(9)  # mutating after the commit does not reach it
    state.epoch = 6
    state.restore()
    assert (state.epoch, state.items) == (5, [0, 7])
    assert WORLD.allgather(state.epoch) == [5] * WORLD.size


def test_durable_commit_restores_the_newest_any_rank_holds(durable):
    state = hvd.elastic.ObjectState(value=0)
    for value in (10, 20, 30):
        state.value = value
        state.commit()
    stores = [durable(r) for r in range(WORLD.size)]
    assert stores[hvd.rank()].numbers() == [3, 2]  # the last two are kept
    WORLD.Barrier()
    if hvd.rank() == 0 and WORLD.size > 1:
        for r in range(WORLD.size):
            if r != WORLD.size - 1:  # only the last rank keeps commit 3
                os.remove(stores[r].path(3))
    WORLD.Barrier()
    fresh = hvd.elastic.ObjectState(value=-1)
    record = elastic.restore_newest(fresh)
    assert record == {"commit": 3, "size": WORLD.size, "restart": 0}
    assert (fresh.value, fresh.commit_number) == (30, 3)
    assert stores[hvd.rank()].numbers()[0] == 3  # ranks that lacked it store it again
    # Nothing newer than what the state holds: nothing to load.
    assert elastic.restore_newest(fresh) is None


def test_a_damaged_newest_commit_is_never_restored(durable):
    state = hvd.elastic.ObjectState(value=1)
    state.commit()
    state.value = 2
    state.commit()
    store = durable(hvd.rank())
    with open(store.path(2), "r+b") as f:  # cut short on every rank
        f.truncate(os.path.getsize(store.path(2)) - 3)
    with open(store.path(3) + ".tmp-1", "wb") as f:  # a newer commit that was never renamed
        f.write(b"partial")
    fresh = hvd.elastic.ObjectState(value=0)
    with pytest.warns(RuntimeWarning, match="incomplete or damaged"):
        elastic.restore_newest(fresh)
    assert (fresh.value, fresh.commit_number) == (1, 1)


def test_run_restores_then_calls_reset_callbacks_then_syncs(durable):
    state = hvd.elastic.ObjectState(epoch=3)
    state.commit()
    resets = []
    fresh = hvd.elastic.ObjectState(epoch=hvd.rank() + 100)
    fresh.register_reset_callbacks([lambda: resets.append(fresh.epoch)])

    @hvd.elastic.run
    def train(s, extra):
        return (s.epoch, extra)

    assert train(fresh, "x") == (3, "x")
    assert resets == [3]
    # Without a newer commit nothing is restored and no reset callback runs.
    assert train(fresh, "y") == (3, "y")
    assert resets == [3]


def test_commits_stay_in_memory_without_a_job_id(settings, shared_dir):
    settings(elastic_job_id=None, elastic_dir=shared_dir)
    state = hvd.elastic.ObjectState(value=1)
    state.commit()
    assert elastic.restore_newest(state) is None
    assert os.listdir(shared_dir) == []


def _raised_everywhere(state) -> list:
    try:
        state.commit()
        raised = False
    except hvd.HostsUpdatedInterrupt as exc:
        raised = exc.skip_sync is False
    return WORLD.allgather(raised)


def test_hosts_updated_interrupt_on_every_rank_as_rank_0_reads(settings, shared_dir, monkeypatch):
    # Rank 0 decides: the others watch a file that never changes, and still raise with it.
    path = os.path.join(shared_dir, "hosts" if hvd.rank() == 0 else f"hosts-{hvd.rank()}")
    with open(path, "w") as f:
        f.write("1\n")
    settings(elastic_hosts_file=path)
    monkeypatch.setattr(elastic, "_hosts_counter", ...)
    elastic.hosts_counter_at_start()
    state = hvd.elastic.ObjectState(step=0)
    assert _raised_everywhere(state) == [False] * WORLD.size
    state.check_host_updates()
    WORLD.Barrier()
    if hvd.rank() == 0:
        with open(path, "w") as f:
            f.write("2\n")
    WORLD.Barrier()
    assert _raised_everywhere(state) == [True] * WORLD.size
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.check_host_updates()


def test_a_malformed_hosts_file_is_an_error_on_every_rank(settings, shared_dir, monkeypatch):
    path = os.path.join(shared_dir, "hosts")
    if hvd.rank() == 0:
        with open(path, "w") as f:
            f.write("three\n")
    WORLD.Barrier()
    settings(elastic_hosts_file=path)
    monkeypatch.setattr(elastic, "_hosts_counter", None)
    with pytest.raises(ValueError, match="should hold one integer"):
        hvd.elastic.ObjectState(step=0).check_host_updates()


def test_torch_state_syncs_restores_and_keeps_commits_apart():
    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    state.sync()
    weights = WORLD.allgather(model.weight.detach().numpy().copy())
    assert all(np.array_equal(w, weights[0]) for w in weights)

    def step():
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()

    step()
    state.epoch = 1
    state.commit()
    committed = model.weight.detach().clone()
    moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    step()
    step()
    state.epoch = 2
    state.restore()
    assert torch.equal(model.weight, committed) and state.epoch == 1
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], moments)
    step()  # the restored optimizer steps on its own tensors, not on the commit's
    state.restore()
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], moments)


def test_elastic_sampler_deals_out_every_index_once_and_records_batches_everywhere():
    dataset = list(range(23))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=4)
    mine = list(sampler)
    everyone = WORLD.allgather(mine)
    assert len({len(share) for share in everyone}) == 1
    assert set().union(*map(set, everyone)) == set(dataset)
    assert sum(map(len, everyone)) - len(dataset) < WORLD.size  # repeats only to even out
    sampler.record_batch(0, 2)
    done = WORLD.allgather(sorted(sampler.processed_indices))
    assert done[0] == sorted({i for share in everyone for i in share[:2]})
    assert all(d == done[0] for d in done)


def test_elastic_sampler_in_a_state_gathers_record_indices_at_commit():
    sampler = hvd.elastic.ElasticSampler(range(12), shuffle=False)
    state = hvd.elastic.TorchState(sampler=sampler)
    sampler.record_indices(sampler.get_indices(0, 1))  # this rank's first index only
    state.commit()
    assert sorted(sampler.processed_indices) == list(range(WORLD.size))
    sampler.set_epoch(0)  # the epoch in progress keeps its position
    assert set(sampler) & set(range(WORLD.size)) == set()
    state.restore()
    sampler.set_epoch(1)
    assert sampler.processed_indices == set() and len(sampler) == -(-12 // WORLD.size)
