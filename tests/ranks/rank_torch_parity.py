"""horovodlite.torch beside Horovod's behaviour: handles, scaling, autograd of the reduce-scatter
and grouped forms (the sum of the ranks' losses, not Horovod's scaling: docs/equivalence.md),
in-place checks, optimizer state and gradient corner cases."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import horovodlite.torch as hvd  # noqa: E402


def test_sparse_allreduce_handle_is_callable():
    r, n = hvd.rank(), hvd.size()
    sparse = torch.sparse_coo_tensor([[0]], [float(r + 1)], (2,))
    handle = hvd.sparse_allreduce_async(sparse, name="sparse.call", op=hvd.Sum)
    assert handle().to_dense().tolist() == [n * (n + 1) / 2, 0.0]
    dense = hvd.allreduce_async(torch.ones(2), name="dense.call", op=hvd.Sum)
    assert dense().tolist() == [float(n)] * 2


def horovod_scaled_sum(values: list, pre: float, post: float):
    """The result Horovod computes: scale and add in the tensor's precision (half in float32)."""
    dtype = values[0].dtype
    math = torch.float32 if dtype == torch.float16 else dtype
    total = None
    for v in values:
        v = (v.to(math) * torch.tensor(pre, dtype=math)).to(dtype)
        total = v if total is None else (total.to(math) + v.to(math)).to(dtype)
    return (total.to(math) * torch.tensor(post, dtype=math)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_scaled_reductions_round_as_horovod(dtype, op):
    n = hvd.size()
    generator = torch.Generator().manual_seed(7)
    # Integers: the sum of the contributions is exact in any order; the scaling rounds.
    values = [torch.randint(0, 50, (2 * n + 1, 3), generator=generator).to(dtype) for _ in range(n)]
    # With more than two ranks the ring adds in another order than the reference: no prescale.
    pre = 0.3 if n <= 2 else 1.0
    post = 1.7
    mine = values[hvd.rank()]
    expected = horovod_scaled_sum(values, pre, post / n if op == hvd.Average else post)
    kwargs = dict(op=op, prescale_factor=pre, postscale_factor=post)
    assert torch.equal(hvd.allreduce(mine, name=f"scaled.{dtype}.{op}", **kwargs), expected)
    rows = hvd.allgather_object(hvd.reducescatter(mine, **kwargs).shape[0])
    start = sum(rows[: hvd.rank()])
    scattered = hvd.reducescatter(mine, **kwargs)
    assert torch.equal(scattered, expected[start : start + rows[hvd.rank()]])
    (grouped,) = hvd.grouped_reducescatter([mine], **kwargs)
    assert torch.equal(grouped, scattered)


SCALINGS = [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 0.5, 3.0),
            (hvd.Average, 2.0, 0.25)]  # fmt: skip


@pytest.mark.parametrize("op, pre, post", SCALINGS)
def test_reducescatter_gradient_is_that_of_the_ranks_summed_losses(op, pre, post):
    r, n = hvd.rank(), hvd.size()
    rows = 2 * n + 1
    x = torch.ones(rows, 2, requires_grad=True)
    y = torch.ones(n + 1, requires_grad=True)
    kwargs = dict(op=op, prescale_factor=pre, postscale_factor=post)
    out = hvd.reducescatter(x, **kwargs)
    (out * (r + 1)).sum().backward()
    # The allgather of the upstream gradients (rank k's rows carry k + 1), times both factors,
    # over the set size for Average. (Horovod's is n times this: its issue #2654.)
    factor = pre * post / (n if op == hvd.Average else 1)
    bounds = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    expected = torch.cat([torch.full((b, 2), (k + 1) * factor) for k, b in enumerate(bounds)])
    torch.testing.assert_close(x.grad, expected)
    grouped = hvd.grouped_reducescatter([x, y], **kwargs)
    x.grad = None
    sum((g * (r + 1)).sum() for g in grouped).backward()
    torch.testing.assert_close(x.grad, expected)
    y_bounds = [(n + 1) // n + (1 if k < (n + 1) % n else 0) for k in range(n)]
    torch.testing.assert_close(
        y.grad, torch.cat([torch.full((b,), (k + 1) * factor) for k, b in enumerate(y_bounds)])
    )


def test_grouped_allgather_is_differentiable():
    r, n = hvd.rank(), hvd.size()
    a = torch.ones(r + 1, 2, requires_grad=True)
    b = torch.ones(1, requires_grad=True)
    gathered = hvd.grouped_allgather([a, b], name="gag.grad")
    assert [g.shape[0] for g in gathered] == [n * (n + 1) // 2, n]
    (gathered[0].sum() * (r + 1) + gathered[1].sum() * 2 * (r + 1)).backward()
    # As the single form: this rank's rows of the upstream gradient summed over the ranks.
    total = n * (n + 1) / 2
    assert a.grad.tolist() == [[total, total]] * (r + 1)
    assert b.grad.tolist() == [2 * total]


def test_alltoall_splits_that_are_not_integers_are_a_value_error():
    n = hvd.size()
    with pytest.raises(ValueError, match="splits must be integers"):
        hvd.alltoall(torch.ones(n, 2), splits=[1.0] * n, name="a2a.floats")


@pytest.mark.parametrize("form", ["allreduce_", "allreduce_async_", "broadcast_",
                                  "broadcast_async_", "grouped_allreduce_"])  # fmt: skip
def test_in_place_collective_is_seen_by_autograd(form):
    x = torch.ones(3, requires_grad=True)
    y = x * 2  # y is saved by the product below: changing it must fail backward, as in torch
    loss = (y * y).sum()
    run = {
        "allreduce_": lambda: hvd.allreduce_(y, name="ip.ar"),
        "allreduce_async_": lambda: hvd.synchronize(hvd.allreduce_async_(y, name="ip.ara")),
        "broadcast_": lambda: hvd.broadcast_(y, root_rank=0, name="ip.bc"),
        "broadcast_async_": lambda: hvd.synchronize(hvd.broadcast_async_(y, 0, name="ip.bca")),
        "grouped_allreduce_": lambda: hvd.grouped_allreduce_([y], name="ip.gar"),
    }
    before = y._version
    run[form]()
    assert y._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_prescale_factor_must_be_finite():
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="prescale_factor must be a finite number"):
            hvd.allreduce(torch.ones(2), name="nan.scale", prescale_factor=bad)
    with pytest.raises(ValueError, match="postscale_factor must be a finite number"):
        hvd.reducescatter(torch.ones(hvd.size()), postscale_factor=float("nan"))


def small_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[1].weight.requires_grad_(False)
    return model


@pytest.mark.parametrize("distributed", [False, True])
def test_broadcast_optimizer_state_leaves_a_new_optimizer_new(distributed):
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, weight_decay=0.1)
    if distributed:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    # No step on zero gradients (Horovod's takes one): no state, no parameter moved.
    assert optimizer.state_dict()["state"] == {}
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    for param in model.parameters():
        if param.requires_grad:
            assert param.grad is not None and not param.grad.any()
            hvd.broadcast(param.grad, root_rank=0)  # works: a tensor, not None
        else:
            assert param.grad is None


def test_broadcast_optimizer_state_of_sparse_adam():
    embedding = torch.nn.Embedding(5, 2, sparse=True)
    optimizer = torch.optim.SparseAdam(embedding.parameters())
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert embedding.weight.grad.is_sparse
    assert optimizer.state_dict()["state"] == {}


def train_step(model, optimizer, x):
    optimizer.zero_grad()
    model(x).sum().backward()


def test_step_after_synchronize_warns_and_reduces_once():
    r, n = hvd.rank(), hvd.size()
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters(),
        op=hvd.Sum,
    )  # fmt: skip
    train_step(model, optimizer, torch.full((1, 2), float(r + 1)))
    optimizer.synchronize()
    with pytest.warns(UserWarning, match="without optimizer.skip_synchronize"):
        optimizer.step()
    # Summed once: each weight moved by -(1 + 2 + ... + n).
    assert model.weight.tolist() == [[-n * (n + 1) / 2] * 2]
    train_step(model, optimizer, torch.ones(1, 2))
    optimizer.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the documented form says nothing
        with optimizer.skip_synchronize():
            optimizer.step()


class EmbeddingBag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embedding = torch.nn.Embedding(6, 3, sparse=True)
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, ids):
        return self.linear(self.embedding(ids)).sum()


def all_equal_across_ranks(model) -> bool:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0))
    return bool((gathered == gathered[0]).all())


@pytest.mark.parametrize("grouping", ["num_groups", "groups", "none"])
def test_sparse_gradient_inside_a_group_keeps_replicas_equal(grouping):
    model = EmbeddingBag()
    options = {
        "num_groups": {"num_groups": 1},
        "groups": {"groups": [[model.embedding.weight, model.linear.weight]]},
        "none": {},
    }[grouping]
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        named_parameters=model.named_parameters(), **options,
    )  # fmt: skip
    for step in range(2):
        optimizer.zero_grad()
        model(torch.tensor([hvd.rank() % 6, step])).backward()
        optimizer.step()
    assert all_equal_across_ranks(model)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_adam_with_either_sparse_setting(sparse_as_dense):
    r, n = hvd.rank(), hvd.size()
    embedding = torch.nn.Embedding(4, 2, sparse=True)
    torch.nn.init.zeros_(embedding.weight)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SparseAdam(embedding.parameters(), lr=0.1),
        named_parameters=embedding.named_parameters(), sparse_as_dense=sparse_as_dense,
    )  # fmt: skip
    optimizer.zero_grad()
    embedding(torch.tensor([r % 4])).sum().backward()
    optimizer.step()
    grad = embedding.weight.grad
    assert grad.is_sparse
    expected = torch.zeros(4, 2)
    for k in range(n):
        expected[k % 4] += 1.0 / n
    torch.testing.assert_close(grad.to_dense(), expected)
    assert all_equal_across_ranks(embedding)


def test_compiled_model_trains_as_the_uncompiled_one():
    r = hvd.rank()
    results = []
    for compiled in (False, True):
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
        )
        # aot_eager traces forward and backward as inductor does, without compiling C++.
        run = torch.compile(model, backend="aot_eager") if compiled else model
        generator = torch.Generator().manual_seed(10 + r)
        for _ in range(3):
            optimizer.zero_grad()
            run(torch.randn(5, 4, generator=generator)).pow(2).mean().backward()
            optimizer.step()
        results.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    torch.testing.assert_close(results[1], results[0])
    assert all_equal_across_ranks(model)


def test_numpy_core_refuses_nan_factor_too():
    import horovodlite as core

    with pytest.raises(ValueError, match="postscale_factor must be a finite number"):
        core.allreduce(np.ones(2), name="np.nan", postscale_factor=float("nan"))
