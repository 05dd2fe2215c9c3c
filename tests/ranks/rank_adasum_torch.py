"""horovodlite.torch with Adasum: the collectives, and the optimizer that combines updates.

The DistributedOptimizer with op=Adasum is Horovod's Adasum optimizer: each rank steps on its
own gradient, and the ranks' updates (new - old parameters) are combined with Adasum. The
oracle is a plain optimizer stepping on a copy of the model, and numpy's Adasum of its updates.
"""

import copy

import numpy as np
import pytest
from oracle import WORLD, adasum_expected, everyone

torch = pytest.importorskip("torch")
import horovodlite.torch as hvd  # noqa: E402

power_of_two = pytest.mark.skipif(
    WORLD.size & (WORLD.size - 1) != 0, reason="Adasum needs a power-of-two number of ranks"
)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def local_batch(step: int):
    generator = torch.Generator().manual_seed(100 * step + hvd.rank())
    return torch.randn(6, 5, generator=generator), torch.randn(6, 2, generator=generator)


@power_of_two
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_allreduce_adasum(dtype):
    x = torch.randn(17, generator=torch.Generator().manual_seed(hvd.rank())).to(dtype)
    inputs = everyone(x.double().numpy())
    out = hvd.allreduce(x, op=hvd.Adasum, name=f"torch.{dtype}")
    assert out.dtype == dtype
    tol = {torch.float16: 1e-2, torch.bfloat16: 6e-2}.get(dtype, 1e-5)
    expected = adasum_expected(inputs)
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=tol, atol=tol * 4)
    # Fused with another tensor, x is still combined alone (the sums of its dot products may
    # round differently, as its slices on the ranks differ).
    outs = hvd.grouped_allreduce([x, x[:3]], op=hvd.Adasum, name=f"torch.group.{dtype}")
    torch.testing.assert_close(outs[0], out, rtol=tol, atol=tol * 4)


@power_of_two
@pytest.mark.parametrize(
    "factory, unchecked",
    [
        (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), 0),
        # Adam's first update is lr * sign(gradient): two ranks' updates can cancel to rounding
        # noise, whose direction (and so its Adasum with the others) is then anyone's guess.
        (lambda params: torch.optim.Adam(params, lr=0.01), 1),
    ],
    ids=["sgd", "adam"],
)
def test_optimizer_combines_the_local_updates(factory, unchecked):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(
        factory(model.parameters()), named_parameters=model.named_parameters(), op=hvd.Adasum
    )
    # The oracle: the same optimizer, stepping alone on this rank's gradient.
    shadow = copy.deepcopy(model)
    plain = factory(shadow.parameters())
    for step in range(4):
        x, y = local_batch(step)
        for net, opt in ((model, optimizer), (shadow, plain)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        starts = [p.detach().clone() for p in shadow.parameters()]
        plain.step()
        optimizer.step()
        # The gradients stay local: Adasum combined the updates, not the gradients.
        for p, grad in zip(model.parameters(), grads):
            assert torch.equal(p.grad, grad)
        with torch.no_grad():
            for p, q, start in zip(model.parameters(), shadow.parameters(), starts):
                updates = everyone((q - start).double().numpy())
                expected = start.double().numpy() + adasum_expected(updates)
                if step >= unchecked:
                    np.testing.assert_allclose(p.double().numpy(), expected, rtol=1e-5, atol=1e-6)
                mine = p.detach().numpy()
                assert all(np.array_equal(mine, other) for other in everyone(mine))
                q.copy_(p)  # the oracle continues from the combined parameters
    # The optimizer's own state (Adam's moments) stays each rank's, from its local gradients.
    assert optimizer.state_dict()["state"].keys() == plain.state_dict()["state"].keys()


@power_of_two
def test_optimizer_with_fp16_compression_and_missing_gradients():
    model = make_model()
    frozen_on_some = model[2].bias
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
        compression=hvd.Compression.fp16,
    )
    x, y = local_batch(0)
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    if hvd.rank() % 2:
        frozen_on_some.grad = None  # this rank's step leaves it alone: a zero update
    before = frozen_on_some.detach().clone()
    optimizer.step()
    after = frozen_on_some.detach().numpy()
    assert all(np.array_equal(after, other) for other in everyone(after))
    if hvd.size() > 1:
        assert not torch.equal(frozen_on_some.detach(), before)


def test_optimizer_needs_a_power_of_two():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    if WORLD.size & (WORLD.size - 1):
        with pytest.raises(ValueError, match=f"power-of-two number of ranks .* has {WORLD.size}"):
            hvd.DistributedOptimizer(sgd, op=hvd.Adasum)
    else:
        assert isinstance(hvd.DistributedOptimizer(sgd, op=hvd.Adasum), torch.optim.SGD)
