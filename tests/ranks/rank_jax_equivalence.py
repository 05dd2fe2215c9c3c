"""Training with horovodlite.jax equals one process on the whole batch (docs/equivalence.md).

n ranks, each initialised differently, broadcast parameters and optax state from rank 0, train
on their uneven parts of every global batch with DistributedOptimizer, and end where one process
ends after the same steps on the whole batch with the plain optimizer: in float64, to 1e-9. For
SGD with momentum and weight decay, Adam, AdamW, Lion and Adafactor; in a jitted step and
eagerly; with backward_passes_per_step 1 and 2; and resumed from a checkpoint that rank 0 saved
and loaded, against the uninterrupted process; and, as a hypothesis property (derandomized, the
same examples on every rank), for drawn layer sizes, uneven batches, steps and those settings.
"""

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jax.config.update("jax_enable_x64", True)
import horovodlite.jax as hvd  # noqa: E402
import jax.numpy as jnp  # noqa: E402

TOLERANCE = 1e-9

OPTIMIZERS = {
    "sgd": lambda: optax.chain(optax.add_decayed_weights(0.05), optax.sgd(0.1, momentum=0.9)),
    "adam": lambda: optax.adam(0.1),
    "adamw": lambda: optax.adamw(0.1, weight_decay=0.05),
    "lion": lambda: optax.lion(0.01, weight_decay=0.05),
    "adafactor": lambda: optax.adafactor(0.1),
}

# The fixed cases: a 3-4-2 MLP, 4 steps, 2 and 3 samples a rank in turn (uneven).
FIXED = {"sizes": (3, 4, 2), "steps": 4, "split": [2, 3], "seed": 7}


def init_mlp(seed: int, sizes=(3, 4, 2)) -> dict:
    """An in-hidden-out tanh MLP of `sizes`, float64."""
    keys = jax.random.split(jax.random.key(seed), 4)
    (a, b, c) = sizes
    return {
        "hidden": {"w": jax.random.normal(keys[0], (a, b)), "b": jax.random.normal(keys[1], (b,))},
        "out": {"w": jax.random.normal(keys[2], (b, c)), "b": jax.random.normal(keys[3], (c,))},
    }


def summed_loss(params, x, y):
    hidden = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return jnp.sum((hidden @ params["out"]["w"] + params["out"]["b"] - y) ** 2)


def counts(example: dict) -> list:
    """The samples of each rank in every global batch (the split repeated over the ranks)."""
    split = example["split"]
    return [split[i % len(split)] for i in range(hvd.size())]


def batches(example: dict, total: int) -> list:
    rng = np.random.default_rng(example["seed"])
    (a, _, c) = example["sizes"]
    return [(rng.normal(size=(total, a)), rng.normal(size=(total, c)))
            for _ in range(example["steps"])]  # fmt: skip


def one_process(make_optimizer, example=FIXED) -> dict:
    """The ground truth: the plain optimizer, the root's initial model, the whole batches."""
    total = sum(counts(example))
    tx = make_optimizer()
    params = init_mlp(100, example["sizes"])
    state = tx.init(params)
    for x, y in batches(example, total):
        grads = jax.grad(lambda p, x=x, y=y: summed_loss(p, x, y) / total)(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


def distributed(make_optimizer, *, jit: bool, passes: int, resume_at=None, example=FIXED) -> dict:
    """Train on n ranks; with `resume_at`, rank 0 saves a checkpoint before that step and every
    rank starts again from a model and optimizer of its own, rank 0 loading the checkpoint."""
    n, r = hvd.size(), hvd.rank()
    mine_counts = counts(example)
    starts = np.cumsum([0, *mine_counts])
    total = int(starts[-1])
    sizes = example["sizes"]
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
    params = init_mlp(100 + r, sizes)  # apart on every rank until the broadcast
    params, state = start(params, tx.init(params))
    for index, (x, y) in enumerate(batches(example, total)):
        if index == resume_at:
            saved = pickle.dumps(jax.device_get((params, state))) if r == 0 else None
            params = init_mlp(200 + r, sizes)  # a new job: every rank builds its own
            state = tx.init(params)
            if r == 0:
                params, state = jax.tree.map(jnp.asarray, pickle.loads(saved))
            params, state = start(params, state)
        mine = slice(starts[r], starts[r + 1])
        # backward_passes_per_step micro-batches, whose losses add up to the rank's loss.
        for part in np.array_split(np.arange(mine_counts[r]), passes):
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


# -- a property: drawn layer sizes, uneven batches, steps, optimizers, passes and resumes --------


@st.composite
def examples(draw):
    steps = draw(st.integers(1, 4))
    return {
        "optimizer": draw(st.sampled_from(sorted(OPTIMIZERS))),
        "sizes": (draw(st.integers(1, 5)), draw(st.integers(1, 6)), draw(st.integers(1, 3))),
        "split": draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)),  # repeated over ranks
        "steps": steps,
        "seed": draw(st.integers(0, 2**16)),
        "jit": draw(st.booleans()),
        "passes": draw(st.sampled_from([1, 2])),
        "resume_at": draw(st.sampled_from([None, *range(1, steps)])),
    }


# Derandomized: every rank draws the same examples in the same order, and each verdict is
# agreed across the ranks before it is asserted, so hypothesis goes on (or shrinks) alike.
@settings(max_examples=6, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck), print_blob=False)  # fmt: skip
@given(examples())
def test_training_equals_one_process_for_drawn_models_batches_and_steps(example):
    make = OPTIMIZERS[example["optimizer"]]
    trained = distributed(make, jit=example["jit"], passes=example["passes"],
                          resume_at=example["resume_at"], example=example)  # fmt: skip
    errors = hvd.allgather_object(difference(trained, one_process(make, example)))
    assert max(errors) <= TOLERANCE, (example, errors)
