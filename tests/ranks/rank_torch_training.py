"""horovodlite.torch training: synchronous SGD equivalence and the DistributedOptimizer contract."""

import copy
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import horovodlite.torch as hvd  # noqa: E402

import horovodlite  # noqa: E402
from horovodlite import fusion as core_fusion  # noqa: E402
from horovodlite.algorithms.pieces import Pieces  # noqa: E402

BATCH, STEPS = 4, 3


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8), torch.nn.Tanh(),
        torch.nn.Linear(8, 1),
    )  # fmt: skip


def global_batches(n):
    generator = torch.Generator().manual_seed(1234)
    return [
        (torch.randn(n * BATCH, 6, generator=generator),
         torch.randn(n * BATCH, 1, generator=generator))
        for _ in range(STEPS)
    ]  # fmt: skip


def reference(optimizer_factory, n):
    """One process training on the concatenated batch of all ranks."""
    model = make_model()
    optimizer = optimizer_factory(model.parameters())
    for x, y in global_batches(n):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return model


def distributed(optimizer_factory, micro_batches=1, set_to_none=True, **options):
    r, n = hvd.rank(), hvd.size()
    model = make_model(seed=r)  # different on purpose: broadcast_parameters must fix it
    optimizer = hvd.DistributedOptimizer(
        optimizer_factory(model.parameters()), named_parameters=model.named_parameters(),
        backward_passes_per_step=micro_batches, **options,
    )  # fmt: skip
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for x, y in global_batches(n):
        mine_x, mine_y = x[r * BATCH : (r + 1) * BATCH], y[r * BATCH : (r + 1) * BATCH]
        optimizer.zero_grad(set_to_none=set_to_none)
        for xs, ys in zip(mine_x.chunk(micro_batches), mine_y.chunk(micro_batches)):
            (torch.nn.functional.mse_loss(model(xs), ys) / micro_batches).backward()
        optimizer.step()
    return model, optimizer


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
}


def assert_same_parameters(model, expected):
    for (name, got), want in zip(model.named_parameters(), expected.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


@pytest.fixture(params=[True, False], ids=["fusion", "no-fusion"])
def fusion(request):
    engine = horovodlite.state.current().engine
    saved = engine.fusion_threshold
    # Every rank runs this fixture at the same point, with no requests in flight.
    engine.fusion_threshold = saved if request.param else 0
    yield request.param
    engine.fusion_threshold = saved


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_matches_single_process_on_the_global_batch(name, fusion):
    model, optimizer = distributed(OPTIMIZERS[name])
    assert isinstance(optimizer, type(OPTIMIZERS[name]([torch.zeros(1, requires_grad=True)])))
    assert_same_parameters(model, reference(OPTIMIZERS[name], hvd.size()))


def make_conv_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Tanh(), torch.nn.Conv2d(4, 2, 2), torch.nn.Flatten(),
        torch.nn.Linear(8, 1),
    )  # fmt: skip


def test_channels_last_model_matches_single_process():
    # A channels_last model's convolution gradients lie in memory in another order than their
    # logical one; on every other rank the model is contiguous. Its training still equals one
    # process training on the global batch (over Gloo the gradients travel as they are).
    r, n = hvd.rank(), hvd.size()
    generator = torch.Generator().manual_seed(77)
    batches = [(torch.randn(n * BATCH, 3, 5, 5, generator=generator),
                torch.randn(n * BATCH, 1, generator=generator)) for _ in range(STEPS)]  # fmt: skip
    last = r % 2 == 0

    def train(model, optimizer, mine):
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(mine(x)), mine(y)).backward()
            optimizer.step()

    expected = make_conv_model()
    train(expected, OPTIMIZERS["sgd"](expected.parameters()), lambda t: t)
    model = make_conv_model(seed=r)
    if last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = hvd.DistributedOptimizer(
        OPTIMIZERS["sgd"](model.parameters()), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def mine(t):
        t = t[r * BATCH : (r + 1) * BATCH]
        return t.contiguous(memory_format=torch.channels_last) if last and t.dim() == 4 else t

    train(model, optimizer, mine)
    assert any(not p.grad.is_contiguous() for p in model.parameters()) == last
    assert_same_parameters(model, expected)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_matches_single_process_with_either_zero_grad_mode(set_to_none):
    # Kept gradients (set_to_none=False) are the same tensors every step, reduced in place again;
    # new ones are autograd's tensors of the step.
    model, _ = distributed(OPTIMIZERS["sgd"], set_to_none=set_to_none)
    assert_same_parameters(model, reference(OPTIMIZERS["sgd"], hvd.size()))


@pytest.mark.parametrize("set_to_none", [True, False])
def test_the_ring_reduces_large_gradients_where_they_lie(set_to_none, monkeypatch):
    # The ring moves a fused batch's large in-place arrays where they lie (horovodlite/fusion.py):
    # here both weights and the first bias, as one group, with the small biases copied beside.
    state = horovodlite.state.current()
    if state.settings.transport == "gloo":
        pytest.skip("Gloo moves the gradients here, not the ring")
    ring = dataclasses.replace(state.settings, allreduce_algorithm="ring")
    monkeypatch.setattr(state, "settings", ring)
    monkeypatch.setattr(core_fusion, "ALONE_BYTES", 64)  # 16 float32s
    given = []  # what the ring was given, each step

    def spy(arrays):
        given.append(Pieces(arrays))
        return given[-1]

    monkeypatch.setattr(core_fusion, "Pieces", spy)
    model, _ = distributed(OPTIMIZERS["sgd"], set_to_none=set_to_none, num_groups=1)
    assert_same_parameters(model, reference(OPTIMIZERS["sgd"], hvd.size()))
    if hvd.size() > 1:
        assert len(given) == STEPS
        for p in model.parameters():
            lies = any(np.shares_memory(a, p.grad.numpy()) for a in given[-1].arrays)
            assert lies == (p.numel() >= 16)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_backward_passes_per_step_accumulates_locally(set_to_none):
    model, _ = distributed(OPTIMIZERS["sgd"], micro_batches=2, set_to_none=set_to_none)
    assert_same_parameters(model, reference(OPTIMIZERS["sgd"], hvd.size()))


@pytest.mark.parametrize("options", [{"num_groups": 2}, {"gradient_predivide_factor": 2.0},
                                     {"compression": hvd.Compression.fp16}])  # fmt: skip
def test_options_keep_the_result(options):
    model, _ = distributed(OPTIMIZERS["sgd"], **options)
    tolerance = 1e-2 if "compression" in options else 1e-5
    for got, want in zip(model.parameters(), reference(OPTIMIZERS["sgd"], hvd.size()).parameters()):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)


def test_state_dict_and_optimizer_state_identical_after_broadcast():
    model, optimizer = distributed(OPTIMIZERS["adam"])
    state = optimizer.state_dict()
    flat = [state["state"][0]["exp_avg"].sum().item(), float(state["state"][0]["step"])]
    everyone = hvd.allgather_object(flat)
    assert all(item == everyone[0] for item in everyone)


def test_parameter_without_gradient_on_one_rank_takes_part():
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        pytest.skip("needs a rank that has the gradient")
    shared, extra = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    params = list(shared.parameters()) + list(extra.parameters())
    named = [(f"p{i}", p) for i, p in enumerate(params)]
    hvd.broadcast_parameters(named, 0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1.0), named_parameters=named)
    loss = shared(torch.ones(1, 2)).sum()
    if r != 0:  # rank 0 never touches `extra`
        loss = loss + extra(torch.ones(1, 2)).sum()
    loss.backward()
    optimizer.synchronize()
    torch.testing.assert_close(extra.weight.grad, torch.full((1, 2), (n - 1) / n))
    with optimizer.skip_synchronize():
        optimizer.step()


def test_zero_grad_refuses_while_reductions_are_pending():
    if hvd.size() == 1:
        pytest.skip("with one rank there is nothing to reduce")
    model = torch.nn.Linear(3, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())  # fmt: skip
    model(torch.ones(2, 3)).sum().backward()
    with pytest.raises(hvd.HorovodLiteError, match="zero_grad"):
        optimizer.zero_grad()
    optimizer.step()
    optimizer.zero_grad()


def test_named_parameters_validation():
    model = torch.nn.Linear(2, 2)
    params = list(model.parameters())
    with pytest.raises(ValueError, match="duplicate names"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1), named_parameters=[
            ("w", params[0]), ("w", params[1])])  # fmt: skip
    with pytest.raises(ValueError, match="missing from named_parameters"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1),
                                 named_parameters=[("w", params[0])])  # fmt: skip


def test_sync_batch_norm_matches_batch_norm_on_the_global_batch():
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(7)
    x = torch.randn(2 * n, 3, 5)
    sync, plain = hvd.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
    mine = x[2 * r : 2 * r + 2].clone().requires_grad_()
    whole = x.clone().requires_grad_()
    out = sync(mine)
    expected = plain(whole)
    torch.testing.assert_close(out, expected[2 * r : 2 * r + 2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sync.running_mean, plain.running_mean)
    torch.testing.assert_close(sync.running_var, plain.running_var)
    # Every rank's loss is its slice; the global loss is their sum, so gradients must match.
    weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weights).sum().backward()
    all_weights = torch.cat(hvd.allgather_object(weights))
    (expected * all_weights).sum().backward()
    torch.testing.assert_close(mine.grad, whole.grad[2 * r : 2 * r + 2], rtol=1e-4, atol=1e-5)


def test_copy_of_wrapped_optimizer_state_dict_loads():
    model = torch.nn.Linear(2, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                         named_parameters=model.named_parameters())  # fmt: skip
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    fresh = torch.optim.Adam(model.parameters())
    fresh.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert fresh.state_dict()["state"][0]["step"] == 1
