"""Gradients through horovodlite.tensorflow's collectives equal one process's (gradient_cases.py).

Eagerly, inside tf.function and in a TF1 graph. Then a contrastive (CLIP-style) model whose loss
reads the embeddings of every rank through hvd.allgather trains with DistributedGradientTape
and with the DistributedOptimizer of a Keras optimizer exactly as one process on the whole batch.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from gradient_cases import (  # noqa: E402
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

tf = pytest.importorskip("tensorflow")
hvd = pytest.importorskip("horovodlite.tensorflow")
keras = pytest.importorskip("keras")

tf1 = tf.compat.v1
TOLERANCE = 1e-9
MODES = ["eager", "function", "graph"]

OPS = Ops(
    concat=lambda ts: tf.concat(ts, 0),
    stack=lambda ts: tf.stack(ts, 0),
    reduce={
        "SUM": lambda s: tf.reduce_sum(s, 0),
        "AVERAGE": lambda s: tf.reduce_sum(s, 0),  # outputs() divides
        "MIN": lambda s: tf.reduce_min(s, 0),
        "MAX": lambda s: tf.reduce_max(s, 0),
        "PRODUCT": lambda s: tf.reduce_prod(s, 0),
    },
)

EVEN = EvenRanks(hvd)  # cases with `subset` reduce within the even ranks' process set
even_ranks = EVEN.module_fixture()


def _call(case: Case, xs: list) -> list:
    return run_collective(hvd, case, xs, EVEN.of(case))


def _expected(case: Case, me: int):
    """One process's outputs of rank `me`, the weights of its outputs, and its input gradients."""
    n = len(case.members(hvd.size()))
    everyone = [[tf.Variable(x) for x in inputs(case, i)] for i in range(n)]
    with tf.GradientTape() as tape:
        ys = outputs(case, everyone, OPS)
        weights = [upstream(case, i, [y.shape for y in ys[i]]) for i in range(n)]
        total = tf.add_n(
            [tf.reduce_sum(c * y) for i in range(n) for c, y in zip(weights[i], ys[i])]
        )
    grads = tape.gradient(total, everyone[me])
    return [y.numpy() for y in ys[me]], weights[me], grads


def _through_horovodlite(case: Case, me: int, weights: list, mode: str):
    """This rank's outputs and input gradients through horovodlite, in `mode`."""
    arrays = inputs(case, me)

    def run(*xs):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            ys = _call(case, list(xs))
            loss = tf.add_n([tf.reduce_sum(c * y) for c, y in zip(weights, ys)])
        return ys, tape.gradient(loss, list(xs))

    if mode == "eager":
        ys, grads = run(*(tf.constant(x) for x in arrays))
    elif mode == "function":
        ys, grads = tf.function(run)(*(tf.constant(x) for x in arrays))
    else:
        with tf.Graph().as_default(), tf1.Session() as session:
            xs = [tf.constant(x) for x in arrays]
            ys = _call(case, xs)
            loss = tf.add_n([tf.reduce_sum(c * y) for c, y in zip(weights, ys)])
            grads = tf1.gradients(loss, xs)
            return session.run((ys, [tf.zeros_like(x) if g is None else g
                                     for g, x in zip(grads, xs)]))  # fmt: skip
    return [y.numpy() for y in ys], [g if g is None else np.asarray(g) for g in grads]


def run_case(case: Case, mode: str = "eager") -> list:
    """Run `case`; return every rank's largest difference from one process (gathered)."""
    members = case.members(hvd.size())
    error = 0.0
    if hvd.rank() in members:
        me = members.index(hvd.rank())
        want_ys, weights, want_grads = _expected(case, me)
        ys, grads = _through_horovodlite(case, me, weights, mode)
        shapes = [x.shape for x in inputs(case, me)]
        for got, want in [*zip(ys, want_ys), *zip(grads, want_grads)]:
            got = np.zeros(0) if got is None else np.asarray(got)
            want = np.zeros_like(got) if want is None else np.asarray(want)
            if got.size or want.size:
                error = max(error, float(np.max(np.abs(got - want))))
        assert [np.shape(g) for g in grads if g is not None] == [
            s for s, g in zip(shapes, grads) if g is not None
        ]
    return hvd.allgather_object(error)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.collective}-{c.op}-{c.seed}")
def test_gradient_equals_one_process(case, mode):
    case = fit(case, hvd.size())
    if case is None:
        pytest.skip("needs more ranks")
    errors = run_case(case, mode)
    assert max(errors) <= TOLERANCE, f"{case} ({mode}): differences by rank {errors}"


test_gradient_equals_one_process_for_random_cases = random_cases_test(
    run_case, TOLERANCE, max_examples=20
)


# -- a contrastive model --------------------------------------------------------------------


def _encoders(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.normal(size=(5, 4))), tf.Variable(rng.normal(size=(3, 4)))]


def _embed(variables, images, texts):
    return (
        tf.math.l2_normalize(tf.matmul(images, variables[0]), axis=1),
        tf.math.l2_normalize(tf.matmul(texts, variables[1]), axis=1),
    )


def _clip_loss(images, texts, all_images, all_texts, first: int, total: int):
    """Sum over this rank's pairs of both cross-entropies, over the whole batch's size."""
    labels = tf.range(first, first + tf.shape(images)[0])
    entropy = tf.nn.sparse_softmax_cross_entropy_with_logits
    to_texts = entropy(labels, tf.matmul(images, all_texts, transpose_b=True) / 0.5)
    to_images = entropy(labels, tf.matmul(texts, all_images, transpose_b=True) / 0.5)
    return (tf.reduce_sum(to_texts) + tf.reduce_sum(to_images)) / (2 * total)


def _batches(steps: int, n: int, seed: int):
    """Every step's whole batch, and where each rank's rows start (rank i has 2 + i % 2)."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum([0, *(2 + i % 2 for i in range(n))])
    return [(rng.normal(size=(starts[-1], 5)), rng.normal(size=(starts[-1], 3)))
            for _ in range(steps)], starts  # fmt: skip


@pytest.mark.parametrize("wrapper", ["tape", "optimizer"])
def test_contrastive_model_over_allgather_trains_as_one_process(wrapper):
    steps, n, r = 4, hvd.size(), hvd.rank()
    batches, starts = _batches(steps, n, seed=3)
    variables = _encoders(100 + r)  # apart on every rank until the broadcast
    hvd.broadcast_variables(variables, root_rank=0)
    reference = _encoders(100)
    optimizer = keras.optimizers.SGD(0.5, momentum=0.9)
    if wrapper == "optimizer":
        optimizer = hvd.DistributedOptimizer(optimizer)
    reference_optimizer = keras.optimizers.SGD(0.5, momentum=0.9)
    for images, texts in batches:
        total, mine = images.shape[0], slice(starts[r], starts[r + 1])
        with tf.GradientTape() as tape:
            image_rows, text_rows = _embed(variables, images[mine], texts[mine])
            all_images, all_texts = hvd.allgather(image_rows), hvd.allgather(text_rows)
            # The ranks' gradients are averaged: n times each rank's share of the batch's loss.
            loss = n * _clip_loss(image_rows, text_rows, all_images, all_texts, starts[r], total)
        if wrapper == "tape":
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))

        with tf.GradientTape() as tape:
            whole_images, whole_texts = _embed(reference, images, texts)
            whole = _clip_loss(whole_images, whole_texts, whole_images, whole_texts, 0, total)
        reference_optimizer.apply_gradients(zip(tape.gradient(whole, reference), reference))
    here = max(float(np.max(np.abs(a.numpy() - b.numpy()))) for a, b in zip(variables, reference))
    moved = float(np.max(np.abs(reference[0].numpy() - _encoders(100)[0].numpy())))
    assert moved > 1e-3, "the reference did not train"
    assert max(hvd.allgather_object(here)) <= TOLERANCE
