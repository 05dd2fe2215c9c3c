"""Training with horovodlite.jax equals one process on the whole batch (docs/equivalence.md).

n ranks, each initialised differently, broadcast parameters and optax state from rank 0, train
on their uneven parts of every global batch with DistributedOptimizer, and end where one process
ends after the same steps on the whole batch with the plain optimizer: in float64, to 1e-9. For
SGD with momentum and weight decay, Adam, AdamW, Lion and Adafactor; in a jitted step and
eagerly; with backward_passes_per_step 1 and 2; and resumed from a checkpoint that rank 0 saved
and loaded, against the uninterrupted process.
"""

import pickle

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jax.config.update("jax_enable_x64", True)
import horovodlite.jax as hvd  # noqa: E402
import jax.numpy as jnp  # noqa: E402

TOLERANCE = 1e-9
STEPS = 4

OPTIMIZERS = {
    "sgd": lambda: optax.chain(optax.add_decayed_weights(0.05), optax.sgd(0.1, momentum=0.9)),
    "adam": lambda: optax.adam(0.1),
    "adamw": lambda: optax.adamw(0.1, weight_decay=0.05),
    "lion": lambda: optax.lion(0.01, weight_decay=0.05),
    "adafactor": lambda: optax.adafactor(0.1),
}


def init_mlp(seed: int) -> dict:
    """A 3-4-2 tanh MLP, float64."""
    keys = jax.random.split(jax.random.key(seed), 4)
    return {
        "hidden": {"w": jax.random.normal(keys[0], (3, 4)), "b": jax.random.normal(keys[1], (4,))},
        "out": {"w": jax.random.normal(keys[2], (4, 2)), "b": jax.random.normal(keys[3], (2,))},
    }


def summed_loss(params, x, y):
    hidden = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return jnp.sum((hidden @ params["out"]["w"] + params["out"]["b"] - y) ** 2)


def batches(total: int) -> list:
    rng = np.random.default_rng(7)
    return [(rng.normal(size=(total, 3)), rng.normal(size=(total, 2))) for _ in range(STEPS)]


def one_process(make_optimizer) -> dict:
    """The ground truth: the plain optimizer, the root's initial model, the whole batches."""
    n = hvd.size()
    total = sum(2 + i % 2 for i in range(n))
    tx = make_optimizer()
    params = init_mlp(100)
    state = tx.init(params)
    for x, y in batches(total):
        grads = jax.grad(lambda p, x=x, y=y: summed_loss(p, x, y) / total)(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


def distributed(make_optimizer, *, jit: bool, passes: int, resume_at=None) -> dict:
    """Train on n ranks; with `resume_at`, rank 0 saves a checkpoint before that step and every
    rank starts again from a model and optimizer of its own, rank 0 loading the checkpoint."""
    n, r = hvd.size(), hvd.rank()
    counts = [2 + i % 2 for i in range(n)]  # uneven: 2 and 3 samples
    starts = np.cumsum([0, *counts])
    total = int(starts[-1])
    tx = hvd.DistributedOptimizer(make_optimizer(), backward_passes_per_step=passes)

    def start(params, state):
        params = hvd.broadcast_parameters(params, root_rank=0)
        return params, hvd.broadcast_optimizer_state(state, root_rank=0)

    def step(params, state, x, y):
        # Rank r's loss is its samples' sum times n / N: the ranks' average is the mean over N.
        grads = jax.grad(lambda p: summed_loss(p, x, y) * n / total)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(step) if jit else step
    params = init_mlp(100 + r)  # apart on every rank until the broadcast
    params, state = start(params, tx.init(params))
    for index, (x, y) in enumerate(batches(total)):
        if index == resume_at:
            saved = pickle.dumps(jax.device_get((params, state))) if r == 0 else None
            params = init_mlp(200 + r)  # a new job: every rank builds its own
            state = tx.init(params)
            if r == 0:
                params, state = jax.tree.map(jnp.asarray, pickle.loads(saved))
            params, state = start(params, state)
        mine = slice(starts[r], starts[r + 1])
        # backward_passes_per_step micro-batches, whose losses add up to the rank's loss.
        for part in np.array_split(np.arange(counts[r]), passes):
            params, state = step(params, state, x[mine][part], y[mine][part])
    return params


def difference(params, expected) -> float:
    pairs = zip(jax.tree.leaves(params), jax.tree.leaves(expected))
    return max(float(jnp.abs(a - b).max()) for a, b in pairs)


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_training_equals_one_process(name, jit, passes):
    make = OPTIMIZERS[name]
    here = difference(distributed(make, jit=jit, passes=passes), one_process(make))
    assert difference(one_process(make), init_mlp(100)) > 1e-3, "the reference did not train"
    errors = hvd.allgather_object(here)
    assert max(errors) <= TOLERANCE, f"{name}: differences by rank {errors}"


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_training_resumed_from_a_checkpoint_equals_one_process(name):
    make = OPTIMIZERS[name]
    here = difference(distributed(make, jit=True, passes=2, resume_at=2), one_process(make))
    errors = hvd.allgather_object(here)
    assert max(errors) <= TOLERANCE, f"{name}: differences by rank {errors}"
