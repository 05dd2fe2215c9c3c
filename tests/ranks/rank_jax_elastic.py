"""hvd.elastic for JAX on every rank: JaxState's commit, restore and sync of pytrees (parameters,
an optax state, a PRNG key), durable commits, ElasticSampler, and run() inside jax.jit."""

import dataclasses
import shutil
import tempfile

import numpy as np
import pytest
from oracle import WORLD

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import horovodlite.jax as hvd  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import io_callback  # noqa: E402

from horovodlite import state as core_state  # noqa: E402
from horovodlite.training import elastic  # noqa: E402

TX = optax.adam(0.1)


def _loss(params, x):
    return jnp.sum((x @ params["w"] + params["b"]) ** 2)


@jax.jit
def _step(params, opt_state, x):
    grads = jax.grad(_loss)(params, x)
    updates, opt_state = TX.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _start(rank: int):
    params = {"w": jnp.full((3, 2), rank + 0.5), "b": jnp.zeros(2) + rank}
    return params, TX.init(params)


def _host(tree):
    """Return `tree` with typed PRNG keys as their data and every array as numpy."""
    tree = jax.tree.map(
        lambda a: jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)
        else a, tree,
    )  # fmt: skip
    return jax.tree.map(np.asarray, tree)


def _equal(a, b) -> bool:
    a, b = _host(a), _host(b)
    same = jax.tree.map(lambda x, y: x.dtype == y.dtype and np.array_equal(x, y), a, b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(jax.tree.leaves(same))


def _same_everywhere(tree) -> bool:
    trees = WORLD.allgather(_host(tree))
    return all(_equal(t, trees[0]) for t in trees)


def _all_jax_arrays(tree) -> bool:
    return all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(tree))


def test_sync_gives_every_rank_rank_0s_pytrees_and_attributes():
    r = hvd.rank()
    params, opt_state = _start(r)
    state = hvd.elastic.JaxState(params, opt_state, key=jax.random.key(r), epoch=r, note=[r])
    state.sync()
    root_params, root_opt = _start(0)
    assert _equal(state.params, root_params) and _equal(state.opt_state, root_opt)
    assert _equal(state.key, jax.random.key(0))
    assert (state.epoch, state.note) == (0, [0])
    assert _all_jax_arrays((state.params, state.opt_state, state.key))
    assert jax.random.key_impl(state.key) == jax.random.key_impl(jax.random.key(0))
    # The synced values are the commit: a restore keeps rank 0's.
    state.params = jax.tree.map(lambda a: a + 1, state.params)
    state.restore()
    assert _equal(state.params, root_params)


def test_commit_keeps_the_pytrees_and_restore_brings_them_back():
    params, opt_state = _start(0)
    state = hvd.elastic.JaxState(params=params, opt_state=opt_state, key=jax.random.key(7),
                                 step=0)  # fmt: skip
    x = jnp.ones((4, 3))
    state.params, state.opt_state = _step(state.params, state.opt_state, x)
    state.key, _ = jax.random.split(state.key)
    state.step = 1
    state.commit()
    assert state.commit_number == 1
    committed = (state.params, state.opt_state, state.key)
    for _ in range(2):  # assignments after the commit do not reach it
        state.params, state.opt_state = _step(state.params, state.opt_state, x)
        state.key, _ = jax.random.split(state.key)
        state.step += 1
    assert not _equal(state.params, committed[0])
    state.restore()
    assert _equal((state.params, state.opt_state, state.key), committed) and state.step == 1
    assert _all_jax_arrays((state.params, state.opt_state, state.key))
    # Training goes on from the restored pytrees exactly as from the committed ones.
    again = _step(state.params, state.opt_state, x)
    assert _equal(again, _step(committed[0], committed[1], x))
    assert _same_everywhere(state.params)


def test_a_donated_buffer_does_not_take_the_commit_with_it():
    params, opt_state = _start(0)
    state = hvd.elastic.JaxState(params=params, opt_state=opt_state)
    state.commit()
    expected = _host(state.params)
    donating = jax.jit(lambda p: jax.tree.map(lambda a: a * 2, p), donate_argnums=0)
    for _ in range(2):  # the second donates arrays that restore() made
        state.params = donating(state.params)
        state.restore()
        assert _equal(state.params, expected)


def test_values_without_jax_arrays_are_plain_attributes():
    state = hvd.elastic.JaxState(table={"a": np.arange(3)}, epoch=0)
    state.table["a"][0] = 9  # mutated in place: ObjectState's deep copies keep the commit
    state.restore()
    assert state.table["a"].tolist() == [0, 1, 2] and state.params is None


@pytest.fixture
def durable(monkeypatch):
    """Durable commits in a folder that rank 0 made, the same on every rank."""
    path = WORLD.bcast(tempfile.mkdtemp(prefix="hvdl-jax-elastic-") if WORLD.rank == 0 else None)
    current = core_state.current()
    settings = dataclasses.replace(current.settings, elastic_job_id="job", elastic_dir=path)
    monkeypatch.setattr(current, "settings", settings)
    yield path
    WORLD.Barrier()
    if WORLD.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def test_a_durable_commit_restores_every_pytree_in_a_new_state(durable):
    params, opt_state = _start(0)
    state = hvd.elastic.JaxState(params, opt_state, key=jax.random.key(3), step=0)
    state.params, state.opt_state = _step(state.params, state.opt_state, jnp.ones((2, 3)))
    state.step = 1
    state.commit()
    mine, theirs = _start(hvd.rank() + 5)
    fresh = hvd.elastic.JaxState(mine, theirs, key=jax.random.key(hvd.rank() + 9), step=-1)
    record = elastic.restore_newest(fresh)
    assert record == {"commit": 1, "size": hvd.size(), "restart": 0}
    assert _equal((fresh.params, fresh.opt_state), (state.params, state.opt_state))
    assert _equal(fresh.key, jax.random.key(3)) and fresh.step == 1
    assert _all_jax_arrays((fresh.params, fresh.opt_state, fresh.key))


def test_run_restores_syncs_and_raises_a_failure_inside_jit_as_horovods(durable, monkeypatch):
    params, opt_state = _start(0)
    state = hvd.elastic.JaxState(params, opt_state, step=4)
    state.commit()
    fresh = hvd.elastic.JaxState(*_start(hvd.rank() + 1), step=0)
    aborted = []

    def abort(code):
        aborted.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(elastic, "_abort", abort)

    @hvd.elastic.run
    def train(s):
        assert s.step == 4 and _equal(s.params, state.params)
        if hvd.size() > 1:  # a shape that differs on rank 1 fails the jitted all-reduce
            x = jnp.ones(3 + (hvd.rank() == 1))
            jax.block_until_ready(jax.jit(lambda a: hvd.allreduce(a, name="elastic.bad"))(x))
        return s.step

    if hvd.size() == 1:
        assert train(fresh) == 4
        return
    with pytest.raises(SystemExit):
        train(fresh)
    assert aborted == [elastic.FAILURE_EXIT_CODE]


def test_run_lets_other_errors_inside_jit_through():
    def fails(x):
        raise ValueError("not a collective's")

    @hvd.elastic.run
    def train(s):
        out = jax.ShapeDtypeStruct((), jnp.float32)
        call = jax.jit(lambda x: io_callback(fails, out, x, ordered=True))
        return jax.block_until_ready(call(jnp.float32(1)))

    with pytest.raises(jax.errors.JaxRuntimeError, match="not a collective's"):
        train(hvd.elastic.JaxState(epoch=0))


def test_elastic_sampler_in_a_jax_state_resumes_the_epoch():
    sampler = hvd.elastic.ElasticSampler(np.arange(12), shuffle=True, seed=2)
    state = hvd.elastic.JaxState(sampler=sampler, epoch=0)
    everyone = WORLD.allgather(list(sampler))
    assert set().union(*map(set, everyone)) == set(range(12))
    sampler.record_batch(0, 1)
    state.commit()
    done = sorted(sampler.processed_indices)
    sampler.record_batch(1, 1)
    state.restore()
    assert sorted(sampler.processed_indices) == done and len(done) == hvd.size()
    assert set(sampler) & set(done) == set()
