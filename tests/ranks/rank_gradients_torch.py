"""Gradients through horovodlite.torch's collectives equal one process's (gradient_cases.py).

Then a contrastive (CLIP-style) model whose loss reads the embeddings of every rank through
hvd.allgather trains with DistributedOptimizer exactly as one process on the whole batch.
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

torch = pytest.importorskip("torch")
hvd = pytest.importorskip("horovodlite.torch")

TOLERANCE = 1e-9

OPS = Ops(
    concat=lambda ts: torch.cat(ts, 0),
    stack=lambda ts: torch.stack(ts, 0),
    reduce={
        "SUM": lambda s: s.sum(0),
        "AVERAGE": lambda s: s.sum(0),  # outputs() divides
        "MIN": lambda s: s.amin(0),
        "MAX": lambda s: s.amax(0),
        "PRODUCT": lambda s: s.prod(0),
    },
)

EVEN = EvenRanks(hvd)  # cases with `subset` reduce within the even ranks' process set
even_ranks = EVEN.module_fixture()


def _call(case: Case, xs: list) -> list:
    return run_collective(hvd, case, xs, EVEN.of(case))


def run_case(case: Case) -> list:
    """Run `case`; return every rank's largest difference from one process (gathered)."""
    members = case.members(hvd.size())
    error = 0.0
    if hvd.rank() in members:
        me = members.index(hvd.rank())
        # One process: every rank's inputs, every rank's outputs, the sum of their losses.
        everyone = [
            [torch.tensor(x, requires_grad=True) for x in inputs(case, i)]
            for i in range(len(members))
        ]
        expected_out = outputs(case, everyone, OPS)
        weights = [
            [torch.tensor(c) for c in upstream(case, i, [y.shape for y in ys])]
            for i, ys in enumerate(expected_out)
        ]
        total = sum((c * y).sum() for cs, ys in zip(weights, expected_out) for c, y in zip(cs, ys))
        expected = torch.autograd.grad(total, everyone[me], allow_unused=True)
        # This rank, through horovodlite.
        xs = [torch.tensor(x, requires_grad=True) for x in inputs(case, me)]
        ys = _call(case, xs)
        loss = sum((c * y).sum() for c, y in zip(weights[me], ys))
        got = torch.autograd.grad(loss, xs, allow_unused=True)
        for y, want in zip(ys, expected_out[me]):
            error = max(error, float((y - want).detach().abs().max()) if y.numel() else 0.0)
        for g, want, x in zip(got, expected, xs):
            g = torch.zeros_like(x) if g is None else g
            want = torch.zeros_like(x) if want is None else want
            error = max(error, float((g - want).abs().max()) if x.numel() else 0.0)
    return hvd.allgather_object(error)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.collective}-{c.op}-{c.seed}")
def test_gradient_equals_one_process(case):
    case = fit(case, hvd.size())
    if case is None:
        pytest.skip("needs more ranks")
    errors = run_case(case)
    assert max(errors) <= TOLERANCE, f"{case}: differences by rank {errors}"


test_gradient_equals_one_process_for_random_cases = random_cases_test(
    run_case, TOLERANCE, max_examples=25
)


def test_adasum_allreduce_has_no_gradient():
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Adasum) if hvd.size() in (1, 2, 4) else None
    if y is None:
        pytest.skip("Adasum needs a power-of-two number of ranks")
    with pytest.raises(ValueError, match="Adasum all-reduce has no gradient"):
        y.sum().backward()


# -- a contrastive model --------------------------------------------------------------------


class Clip(torch.nn.Module):
    """Two linear encoders; the loss matches each image to its text among the whole batch."""

    def __init__(self, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.image = torch.nn.Parameter(torch.randn(5, 4, generator=generator))
        self.text = torch.nn.Parameter(torch.randn(3, 4, generator=generator))

    def embed(self, images, texts):
        return (
            torch.nn.functional.normalize(images @ self.image, dim=1),
            torch.nn.functional.normalize(texts @ self.text, dim=1),
        )


def clip_loss(images, texts, all_images, all_texts, first: int, total: int):
    """Sum over this rank's pairs (rows first.. of the whole batch) of both cross-entropies,
    divided by the whole batch's size: the ranks' losses add up to the whole batch's mean."""
    labels = torch.arange(first, first + images.shape[0])
    entropy = torch.nn.functional.cross_entropy
    to_texts = entropy(images @ all_texts.T / 0.5, labels, reduction="sum")
    to_images = entropy(texts @ all_images.T / 0.5, labels, reduction="sum")
    return (to_texts + to_images) / (2 * total)


def _batches(steps: int, n: int, seed: int):
    """Every step's whole batch, and each rank's rows of it (uneven: rank i has 2 + i % 2)."""
    rng = np.random.default_rng(seed)
    counts = [2 + i % 2 for i in range(n)]
    starts = np.cumsum([0, *counts])
    batches = [(rng.normal(size=(starts[-1], 5)), rng.normal(size=(starts[-1], 3)))
               for _ in range(steps)]  # fmt: skip
    return batches, starts


@pytest.mark.parametrize("make_optimizer", [
    lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=0.05),
], ids=["sgd", "adam"])  # fmt: skip
def test_contrastive_model_over_allgather_trains_as_one_process(make_optimizer):
    torch.set_default_dtype(torch.float64)
    try:
        steps, n, r = 4, hvd.size(), hvd.rank()
        batches, starts = _batches(steps, n, seed=3)
        model = Clip(seed=100 + r)  # apart on every rank until the broadcast
        optimizer = make_optimizer(model.parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        reference = Clip(seed=100)
        reference_optimizer = make_optimizer(reference.parameters())
        for images, texts in batches:
            total = images.shape[0]
            mine = slice(starts[r], starts[r + 1])
            image_rows, text_rows = model.embed(
                torch.tensor(images[mine]), torch.tensor(texts[mine])
            )
            all_images, all_texts = hvd.allgather(image_rows), hvd.allgather(text_rows)
            # DistributedOptimizer averages the ranks' gradients: n times each rank's share.
            first = int(starts[r])
            loss = n * clip_loss(image_rows, text_rows, all_images, all_texts, first, total)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            whole_images, whole_texts = reference.embed(torch.tensor(images), torch.tensor(texts))
            whole = clip_loss(whole_images, whole_texts, whole_images, whole_texts, 0, total)
            reference_optimizer.zero_grad()
            whole.backward()
            reference_optimizer.step()
        here = max(float((a - b).detach().abs().max()) for a, b in
                   zip(model.parameters(), reference.parameters()))  # fmt: skip
        moved = float((reference.image - Clip(seed=100).image).detach().abs().max())
    finally:
        torch.set_default_dtype(torch.float32)
    assert moved > 1e-3, "the reference did not train"
    assert max(hvd.allgather_object(here)) <= TOLERANCE
