"""ZeroOptimizer on every rank: the same training as DistributedOptimizer with 1/n of the state,
checkpoints that load at another rank count or into a plain optimizer, and clear errors."""

import pytest

torch = pytest.importorskip("torch")
import horovodlite.torch as hvd  # noqa: E402

GLOBAL_BATCH = 12  # divides by 1, 2, 3 and 4 ranks: the averaged gradient is the same at each
BUCKET_MB = 400 / 2**20  # 100 float32 per bucket: buckets that cut parameters, and several


class Model(torch.nn.Module):
    """Parameter sizes 91, 13, 65, 5, 5, 1: none divides evenly by 3 or 4."""

    def __init__(self, sometimes_unused=True):
        super().__init__()
        self.sometimes_unused = sometimes_unused
        torch.manual_seed(0)
        self.first = torch.nn.Linear(7, 13)
        self.second = torch.nn.Linear(13, 5)
        self.last = torch.nn.Linear(5, 1)
        if sometimes_unused:
            self.unused = torch.nn.Linear(2, 2)  # gets a gradient on some steps only

    def forward(self, x, step=0):
        out = self.last(torch.tanh(self.second(torch.tanh(self.first(x)))))
        if self.sometimes_unused and step % 3 == 0:
            out = out + self.unused(x[:, :2]).sum(dim=1, keepdim=True)
        return out


def batch(step, ranks, rank):
    generator = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, 7, generator=generator)
    y = torch.randn(GLOBAL_BATCH, 1, generator=generator)
    rows = GLOBAL_BATCH // ranks
    return x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
}


def param_groups(model, two_groups):
    if not two_groups:
        return model.parameters()
    rest = [p for name, p in model.named_parameters() if not name.startswith("first")]
    return [{"params": model.first.parameters(), "lr": 0.02}, {"params": rest}]


def train(model, optimizer, steps, *, start=0, clip=None, passes=1, distributed=True,
          process_set=hvd.global_process_set):  # fmt: skip
    ranks, rank = (process_set.size(), process_set.rank()) if distributed else (1, 0)
    for step in range(start, start + steps):
        optimizer.zero_grad()
        x, y = batch(step, ranks, rank)
        for xs, ys in zip(x.chunk(passes), y.chunk(passes)):
            loss = torch.nn.functional.mse_loss(model(xs, step), ys) / passes
            loss.backward()
        if clip is None:
            optimizer.step()
        elif hasattr(optimizer, "clip_grad_norm_"):  # a ZeroOptimizer
            optimizer.clip_grad_norm_(clip)
            optimizer.step()
        else:
            if distributed:
                optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if distributed:
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()


def assert_same(model, expected):
    for (name, got), want in zip(model.named_parameters(), expected.parameters()):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-6, msg=name)


@pytest.mark.parametrize("variant", ["plain", "clip", "two_groups"])
@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_trains_as_distributed_optimizer(name, stage, variant):
    clip = 0.05 if variant == "clip" else None
    runs = []
    for zero in (False, True):
        model = Model()
        optimizer = OPTIMIZERS[name](param_groups(model, variant == "two_groups"))
        if zero:
            optimizer = hvd.ZeroOptimizer(optimizer, named_parameters=model.named_parameters(),
                                          stage=stage, bucket_cap_mb=BUCKET_MB)  # fmt: skip
        else:
            named = model.named_parameters()
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=named)
        train(model, optimizer, 20, clip=clip)
        runs.append(model)
    assert_same(runs[1], runs[0])


def state_bytes(optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in optimizer.state.values()
               for v in s.values() if torch.is_tensor(v))  # fmt: skip


@pytest.mark.parametrize("stage", [1, 2])
def test_each_rank_holds_its_share_of_the_state(stage):
    n = hvd.size()
    plain_model, model = Model(), Model()
    plain = torch.optim.AdamW(plain_model.parameters())
    train(plain_model, plain, 1, distributed=False)
    zero = hvd.ZeroOptimizer(torch.optim.AdamW(model.parameters()), stage=stage,
                             bucket_cap_mb=BUCKET_MB)  # fmt: skip
    train(model, zero, 1)
    largest = max(state_bytes(plain) // len(plain.state), 1)  # one parameter's worth, at most
    assert state_bytes(zero) <= state_bytes(plain) / n + largest
    everyone = hvd.allgather_object(state_bytes(zero))
    assert sum(everyone) <= state_bytes(plain) + n * 2 * 8  # only 'step' counts are repeated
    if stage == 2:  # the full gradients are gone once reduced
        zero.synchronize()
        assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("stage", [1, 2])
def test_checkpoint_resumes_at_fewer_ranks_and_in_a_plain_optimizer(stage):
    # Every parameter gets a gradient on every step: a plain optimizer skips a parameter without
    # one, where DistributedOptimizer and ZeroOptimizer (as Horovod) step it with zeros.
    n = hvd.size()
    model = Model(sometimes_unused=False)
    optimizer = hvd.ZeroOptimizer(torch.optim.AdamW(param_groups(model, True), lr=0.01),
                                  stage=stage, bucket_cap_mb=BUCKET_MB)  # fmt: skip
    train(model, optimizer, 4)
    checkpoint = optimizer.state_dict()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    train(model, optimizer, 4, start=4)  # the uninterrupted run
    # At n - 1 ranks (a process set of the first ones), from the checkpoint.
    fewer = hvd.add_process_set(list(range(max(n - 1, 1))))
    try:
        if hvd.rank() in fewer.ranks:
            resumed = Model(sometimes_unused=False)
            resumed.load_state_dict(weights)
            again = hvd.ZeroOptimizer(torch.optim.AdamW(param_groups(resumed, True), lr=0.01),
                                      stage=stage, bucket_cap_mb=BUCKET_MB * 3,
                                      process_set=fewer)  # fmt: skip
            again.load_state_dict(checkpoint)
            train(resumed, again, 4, start=4, process_set=fewer)
            assert_same(resumed, model)
    finally:
        hvd.remove_process_set(fewer)
    # In a plain optimizer, on one process.
    plain_model = Model(sometimes_unused=False)
    plain_model.load_state_dict(weights)
    plain = torch.optim.AdamW(param_groups(plain_model, True), lr=0.01)
    plain.load_state_dict(checkpoint)
    train(plain_model, plain, 4, start=4, distributed=False)
    assert_same(plain_model, model)


def test_wrapping_an_optimizer_with_state_keeps_it():
    reference = Model()
    train(reference, hvd.DistributedOptimizer(torch.optim.Adam(reference.parameters(), lr=0.01)), 5)
    model = Model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, hvd.DistributedOptimizer(optimizer), 2)
    # The model and its optimizer's state, moved on: wrapped with state, training goes on alike.
    moved = Model()
    moved.load_state_dict(model.state_dict())
    fresh = torch.optim.Adam(moved.parameters(), lr=0.01)
    fresh.load_state_dict(optimizer.state_dict())
    train(moved, hvd.ZeroOptimizer(fresh, stage=2, bucket_cap_mb=BUCKET_MB), 3, start=2)
    assert_same(moved, reference)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_accumulation_and_zero_grad_forms(set_to_none):
    runs = []
    for zero in (False, True):
        model = Model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        if zero:
            optimizer = hvd.ZeroOptimizer(optimizer, stage=2, backward_passes_per_step=2,
                                          bucket_cap_mb=BUCKET_MB)  # fmt: skip
        else:
            optimizer = hvd.DistributedOptimizer(optimizer, backward_passes_per_step=2)
        for step in range(5):
            optimizer.zero_grad(set_to_none=set_to_none)
            x, y = batch(step, hvd.size(), hvd.rank())
            for xs, ys in zip(x.chunk(2), y.chunk(2)):
                (torch.nn.functional.mse_loss(model(xs, step), ys) / 2).backward()
            optimizer.step()
        runs.append(model)
    assert_same(runs[1], runs[0])


def test_mistakes_are_clear_errors():
    model = Model()
    with pytest.raises(TypeError, match="LBFGS needs whole parameters: use DistributedOptimizer"):
        hvd.ZeroOptimizer(torch.optim.LBFGS(model.parameters()))
    zero = hvd.ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="already a ZeroOptimizer"):
        hvd.ZeroOptimizer(zero)
    with pytest.raises(TypeError, match="already a ZeroOptimizer"):
        hvd.DistributedOptimizer(zero)  # both would hook the gradients
    distributed = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for wrap in (hvd.DistributedOptimizer, hvd.ZeroOptimizer):
        with pytest.raises(TypeError, match="already a DistributedOptimizer"):
            wrap(distributed)
    with pytest.raises(ValueError, match="stage must be 1 or 2"):
        hvd.ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), stage=3)
    with pytest.raises(ValueError, match="missing from named_parameters"):
        hvd.ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                          named_parameters=list(model.named_parameters())[1:])  # fmt: skip
    with pytest.raises(ValueError, match="takes no closure"):
        zero.step(lambda: 0.0)


def test_different_models_are_refused_on_every_rank():
    torch.manual_seed(0)
    width = 3 if hvd.rank() == hvd.size() - 1 else 4
    model = torch.nn.Linear(width, 2)
    if hvd.size() == 1:
        pytest.skip("one rank cannot differ from itself")
    with pytest.raises(ValueError, match=r"the ranks optimize different models: rank \d+ has"):
        hvd.ZeroOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                          named_parameters=model.named_parameters())  # fmt: skip


def test_learning_rate_scheduler_and_compression():
    runs = []
    for zero in (False, True):
        model = Model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
        if zero:
            optimizer = hvd.ZeroOptimizer(optimizer, stage=2, compression=hvd.Compression.fp16,
                                          bucket_cap_mb=BUCKET_MB)  # fmt: skip
        else:
            optimizer = hvd.DistributedOptimizer(optimizer, compression=hvd.Compression.fp16)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        for step in range(5):
            train(model, optimizer, 1, start=step)
            scheduler.step()
        assert optimizer.param_groups[0]["lr"] == 0.1 * 0.5**2
        runs.append(model)
    # float16 on the wire: reduce-scatter and all-reduce round alike, to float16's precision.
    for got, want in zip(runs[1].parameters(), runs[0].parameters()):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    assert all_equal(runs[1])


def all_equal(model) -> bool:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0))
    return bool((gathered == gathered[0]).all())
