"""Gradients through horovodlite.jax's collectives equal one process's (gradient_cases.py),
eagerly and inside jax.jit.

Then a contrastive (CLIP-style) model whose loss reads the embeddings of every rank through
hvd.allgather trains with DistributedOptimizer, in a jitted step, exactly as one process on the
whole batch.
"""

import numpy as np
import pytest
from gradient_cases import (
    CASES,
    Case,
    EvenRanks,
    Ops,
    fit,
    inputs,
    outputs,
    random_cases_test,
    run_collective,
    upstream,
)

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jax.config.update("jax_enable_x64", True)
import horovodlite.jax as hvd  # noqa: E402
import jax.numpy as jnp  # noqa: E402

TOLERANCE = 1e-9

OPS = Ops(
    concat=lambda arrays: jnp.concatenate(arrays, 0),
    stack=lambda arrays: jnp.stack(arrays, 0),
    reduce={
        "SUM": lambda s: s.sum(0),
        "AVERAGE": lambda s: s.sum(0),  # outputs() divides
        "MIN": lambda s: s.min(0),
        "MAX": lambda s: s.max(0),
        "PRODUCT": lambda s: s.prod(0),
    },
)

EVEN = EvenRanks(hvd)  # cases with `subset` reduce within the even ranks' process set
even_ranks = EVEN.module_fixture()


class Traced:
    """horovodlite.jax as run_collective() calls it inside jax.jit, told the shapes that depend
    on other ranks: every rank's rows for allgather, the received splits for alltoall."""

    def __init__(self, case: Case):
        self.case = case
        self.members = case.members(hvd.size())

    def __getattr__(self, name):
        return getattr(hvd, name)

    def allgather(self, x, process_set):
        return hvd.allgather(x, process_set=process_set, rows=self.case.rows[0])

    def grouped_allgather(self, xs, process_set):
        return hvd.grouped_allgather(xs, process_set=process_set, rows=list(self.case.rows))

    def alltoall(self, x, splits, process_set):
        me = self.members.index(hvd.rank())
        received = [row[me] for row in self.case.splits]
        return hvd.alltoall(x, splits, process_set=process_set, received_splits=received)


def run_case(case: Case, jit: bool = False) -> list:
    """Run `case`; return every rank's largest difference from one process (gathered)."""
    members = case.members(hvd.size())
    error = 0.0
    if hvd.rank() in members:
        me = members.index(hvd.rank())
        everyone = [[jnp.asarray(x) for x in inputs(case, i)] for i in range(len(members))]
        shapes = [[y.shape for y in ys] for ys in outputs(case, everyone, OPS)]
        weights = [[jnp.asarray(c) for c in upstream(case, i, s)] for i, s in enumerate(shapes)]

        # One process: every rank's inputs, every rank's outputs, the sum of their losses.
        def total(xs):
            ys = outputs(case, xs, OPS)
            return sum((c * y).sum() for cs, y_s in zip(weights, ys) for c, y in zip(cs, y_s))

        expected = jax.grad(total)(everyone)[me]
        expected_out = outputs(case, everyone, OPS)[me]
        # This rank, through horovodlite.
        binding = Traced(case) if jit else hvd
        process_set = EVEN.of(case)

        def loss(xs):
            ys = run_collective(binding, case, xs, process_set)
            return sum((c * y).sum() for c, y in zip(weights[me], ys)), ys

        gradient = jax.value_and_grad(loss, has_aux=True)
        (_, ys), got = (jax.jit(gradient) if jit else gradient)(everyone[me])
        for y, want in zip(ys, expected_out):
            error = max(error, float(jnp.abs(y - want).max()) if y.size else 0.0)
        for g, want in zip(got, expected):
            error = max(error, float(jnp.abs(g - want).max()) if g.size else 0.0)
    return hvd.allgather_object(error)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.collective}-{c.op}-{c.seed}")
def test_gradient_equals_one_process(case, jit):
    case = fit(case, hvd.size())
    if case is None:
        pytest.skip("needs more ranks")
    errors = run_case(case, jit)
    assert max(errors) <= TOLERANCE, f"{case}: differences by rank {errors}"


test_gradient_equals_one_process_for_random_cases = random_cases_test(
    run_case, TOLERANCE, max_examples=15
)


def test_adasum_allreduce_has_no_gradient():
    if hvd.size() not in (1, 2, 4):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    x = jnp.ones(4)
    with pytest.raises(ValueError, match="Adasum all-reduce has no gradient"):
        jax.grad(lambda x: hvd.allreduce(x, op=hvd.Adasum).sum())(x)


def test_integer_inputs_have_no_gradient_but_take_part():
    n = hvd.size()

    def loss(x, counts):
        total, gathered = hvd.grouped_allreduce([x, counts], op=hvd.Sum)
        return (total * gathered.sum()).sum()

    counts = jnp.ones(2, dtype=jnp.int32)
    for step in (jax.grad(loss), jax.jit(jax.grad(loss))):
        assert np.asarray(step(jnp.ones(3), counts)).tolist() == [2.0 * n * n] * 3


# -- a contrastive model --------------------------------------------------------------------


def init_clip(seed: int) -> dict:
    key_image, key_text = jax.random.split(jax.random.key(seed))
    return {
        "image": jax.random.normal(key_image, (5, 4)),
        "text": jax.random.normal(key_text, (3, 4)),
    }


def embed(params, images, texts):
    def normalize(v):
        return v / jnp.linalg.norm(v, axis=1, keepdims=True)

    return normalize(images @ params["image"]), normalize(texts @ params["text"])


def clip_loss(images, texts, all_images, all_texts, first, total: int):
    """Sum over this rank's pairs (rows first.. of the whole batch) of both cross-entropies,
    divided by the whole batch's size: the ranks' losses add up to the whole batch's mean."""
    labels = first + jnp.arange(images.shape[0])
    entropy = optax.softmax_cross_entropy_with_integer_labels
    to_texts = entropy(images @ all_texts.T / 0.5, labels).sum()
    to_images = entropy(texts @ all_images.T / 0.5, labels).sum()
    return (to_texts + to_images) / (2 * total)


@pytest.mark.parametrize("make_optimizer", [
    lambda: optax.sgd(0.5, momentum=0.9),
    lambda: optax.adam(0.05),
], ids=["sgd", "adam"])  # fmt: skip
def test_contrastive_model_over_allgather_trains_as_one_process(make_optimizer):
    steps, n, r = 4, hvd.size(), hvd.rank()
    rng = np.random.default_rng(3)
    counts = [2 + i % 2 for i in range(n)]  # uneven: rank i has 2 + i % 2 pairs
    starts = np.cumsum([0, *counts])
    total = int(starts[-1])
    batches = [(rng.normal(size=(total, 5)), rng.normal(size=(total, 3))) for _ in range(steps)]
    params = hvd.broadcast_parameters(init_clip(100 + r), root_rank=0)  # apart until here
    tx = hvd.DistributedOptimizer(make_optimizer())
    state = hvd.broadcast_optimizer_state(tx.init(params), root_rank=0)

    @jax.jit
    def step(params, state, images, texts):
        def loss(params):
            image_rows, text_rows = embed(params, images, texts)
            all_images = hvd.allgather(image_rows, rows=counts)
            all_texts = hvd.allgather(text_rows, rows=counts)
            # DistributedOptimizer averages the ranks' gradients: n times each rank's share.
            return n * clip_loss(image_rows, text_rows, all_images, all_texts, starts[r], total)

        grads = jax.grad(loss)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    reference = init_clip(100)
    reference_tx = make_optimizer()
    reference_state = reference_tx.init(reference)

    @jax.jit
    def reference_step(params, state, images, texts):
        def loss(params):
            all_images, all_texts = embed(params, images, texts)
            return clip_loss(all_images, all_texts, all_images, all_texts, 0, total)

        updates, state = reference_tx.update(jax.grad(loss)(params), state, params)
        return optax.apply_updates(params, updates), state

    mine = slice(starts[r], starts[r + 1])
    for images, texts in batches:
        params, state = step(params, state, images[mine], texts[mine])
        reference, reference_state = reference_step(reference, reference_state, images, texts)
    here = max(float(jnp.abs(params[k] - reference[k]).max()) for k in params)
    moved = float(jnp.abs(reference["image"] - init_clip(100)["image"]).max())
    assert moved > 1e-3, "the reference did not train"
    assert max(hvd.allgather_object(here)) <= TOLERANCE
