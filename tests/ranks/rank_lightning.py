"""HorovodLiteStrategy at any rank count: Lightning's fit equals one process on the whole batch.

Lightning gives each rank a DistributedSampler that shuffles the training rows with the
permutation of epoch e (seed 0 + e) and takes its entries rank, rank+size, ...; with B rows per
rank, step s of all ranks together covers entries [s*B*size, (s+1)*B*size) of the permutation:
the batch that one process with batch size B*size trains on. The reference loop below trains on
those batches in float64 without Lightning.
"""

import os

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("pytorch_lightning")

import horovodlite.torch as hvd  # noqa: E402
from horovodlite.lightning import HorovodLiteStrategy  # noqa: E402  (registers "horovodlite")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

hvd.init()
SIZE, RANK = hvd.size(), hvd.rank()
ROWS = 2  # per rank and batch
FEATURES, HIDDEN = 5, 4


class Regression(pl.LightningModule):
    """A two-layer float64 regression; the weights differ per rank until the broadcast."""

    def __init__(self, seed: int, lr: float = 0.1, momentum: float = 0.0, dtype=torch.float64):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
        ).to(dtype)
        with torch.no_grad():
            for p in self.net.parameters():
                # Drawn in float64 whatever the dtype: a float32 model starts where float64 does.
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64) * 0.5)
        self.lr, self.momentum = lr, momentum

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        squared = ((self(x) - y) ** 2).sum()
        self.log("test_sse", squared, sync_dist=True, reduce_fx="sum")
        self.log("test_max", (self(x) - y).abs().max(), sync_dist=True, reduce_fx="max")

    def predict_step(self, batch, batch_idx):
        x, _ = batch
        return self(x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


def data(steps: int, dtype=torch.float64, seed: int = 7):
    """Return (x, y) of steps * ROWS * SIZE rows, the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * ROWS * SIZE, FEATURES, generator=generator, dtype=dtype)
    y = x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(len(x), 1, generator=generator,
                                                              dtype=dtype)  # fmt: skip
    return x, y


def loader(x, y):
    return DataLoader(TensorDataset(x, y), batch_size=ROWS, shuffle=False)


def trainer(**kwargs):
    options = dict(strategy="horovodlite", accelerator="cpu", devices=1, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, max_epochs=1)  # fmt: skip
    options.update(kwargs)
    return pl.Trainer(**options)


def reference(x, y, epochs: int, accumulate: int = 1, momentum: float = 0.0, clip=None):
    """Train rank 0's initial model on one process: whole batches of ROWS * SIZE rows."""
    model = Regression(seed=0, momentum=momentum)
    optimizer = model.configure_optimizers()
    batch = ROWS * SIZE
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        batches = [(x[order[i : i + batch]], y[order[i : i + batch]])
                   for i in range(0, len(x), batch)]  # fmt: skip
        for start in range(0, len(batches), accumulate):
            optimizer.zero_grad()
            for bx, by in batches[start : start + accumulate]:
                # Lightning divides each loss by accumulate_grad_batches, also in a short group.
                (torch.nn.functional.mse_loss(model(bx), by) / accumulate).backward()
            if clip is not None:
                torch.nn.utils.clip_grad_value_(model.parameters(), clip)
            optimizer.step()
    return model


def assert_same_parameters(model, expected, tolerance=1e-9):
    for (name, got), want in zip(model.named_parameters(), expected.parameters()):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance, msg=name)


def test_strategy_name_builds_the_strategy():
    assert isinstance(trainer().strategy, HorovodLiteStrategy)
    assert trainer().global_rank == RANK and trainer().world_size == SIZE


def test_fit_equals_one_process_on_the_whole_batch():
    x, y = data(steps=3)
    model = Regression(seed=RANK, momentum=0.9)  # rank 0's weights must win
    fit = trainer(max_epochs=2)
    fit.fit(model, loader(x, y))
    assert_same_parameters(model, reference(x, y, epochs=2, momentum=0.9))
    assert type(fit.optimizers[0]).__mro__[1].__module__ == "horovodlite.torch.optimizer"


@pytest.mark.parametrize("steps", [4, 5])  # 5: the epoch ends with a group of one batch
def test_accumulated_gradients_equal_one_process(steps):
    x, y = data(steps=steps)
    model = Regression(seed=RANK)
    trainer(max_epochs=2, accumulate_grad_batches=2).fit(model, loader(x, y))
    assert_same_parameters(model, reference(x, y, epochs=2, accumulate=2))


class ManualRegression(Regression):
    """The same model, stepped by hand (Lightning's manual optimization)."""

    def __init__(self, seed: int):
        super().__init__(seed)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad()
        x, y = batch
        self.manual_backward(torch.nn.functional.mse_loss(self(x), y))
        optimizer.step()


def test_manual_optimization_equals_one_process():
    x, y = data(steps=3)
    model = ManualRegression(seed=RANK)
    trainer(max_epochs=2).fit(model, loader(x, y))
    assert_same_parameters(model, reference(x, y, epochs=2))


def test_gradient_clipping_sees_the_averaged_gradients():
    x, y = data(steps=2)
    model = Regression(seed=RANK)
    trainer(gradient_clip_val=0.05, gradient_clip_algorithm="value").fit(model, loader(x, y))
    assert_same_parameters(model, reference(x, y, epochs=1, clip=0.05))


def test_validate_and_test_reduce_logged_values_over_ranks():
    x, y = data(steps=3, seed=11)
    model = Regression(seed=RANK)
    run = trainer()
    expected = Regression(seed=0)
    with torch.no_grad():
        errors = expected(x) - y
    [validated] = run.validate(model, loader(x, y), verbose=False)
    # Each rank's mean over equal batches, averaged over the ranks: the mean over all rows.
    assert validated["val_loss"] == pytest.approx(float((errors**2).mean()), rel=1e-9)
    [tested] = run.test(model, loader(x, y), verbose=False)
    assert tested["test_sse"] == pytest.approx(float((errors**2).sum()), rel=1e-9)
    assert tested["test_max"] == pytest.approx(float(errors.abs().max()), rel=1e-9)


def test_predict_gives_each_rank_its_shard():
    x, y = data(steps=2)
    model = Regression(seed=RANK)
    predictions = torch.cat(trainer().predict(model, loader(x, y)))
    with torch.no_grad():
        expected = Regression(seed=0)(x)
    torch.testing.assert_close(predictions, expected[RANK::SIZE], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_accelerator_gpu_takes_the_local_ranks_gpu_or_says_why_not(gpus, monkeypatch):
    """GPU local_rank where the host has one per rank; shared over MPI; else a clear error."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)

    def root_device(transport: str):
        monkeypatch.setenv("HOROVODLITE_TRANSPORT", transport)
        return HorovodLiteStrategy(parallel_devices=[torch.device("cuda", 0)]).root_device

    local, per_host = hvd.local_rank(), hvd.local_size()
    if per_host <= gpus:
        assert root_device("auto") == torch.device("cuda", local)
    else:  # every rank of the host raises, before any collective
        with pytest.raises(ValueError, match=f"with {per_host} ranks on host .* HOROVODLITE_TRA"):
            root_device("auto")
    assert root_device("mpi") == torch.device("cuda", local % gpus)


def test_collectives_on_the_strategy():
    strategy = trainer().strategy
    gathered = strategy.all_gather(torch.tensor([RANK, 10 * RANK]))
    assert gathered.tolist() == [[r, 10 * r] for r in range(SIZE)]
    assert strategy.broadcast({"from": RANK}, src=SIZE - 1) == {"from": SIZE - 1}
    strategy.barrier("everyone")
    value = torch.tensor(float(RANK + 1), dtype=torch.float64)
    assert float(strategy.reduce(value)) == pytest.approx((SIZE + 1) / 2)
    assert float(strategy.reduce(value, reduce_op="sum")) == SIZE * (SIZE + 1) / 2
    assert float(strategy.reduce(value, reduce_op="max")) == SIZE
    assert float(strategy.reduce(value, reduce_op=torch.distributed.ReduceOp.MIN)) == 1
    assert float(strategy.reduce(torch.tensor(RANK + 1))) == pytest.approx((SIZE + 1) / 2)
    assert strategy.reduce("not a tensor") == "not a tensor"
    assert strategy.reduce_boolean_decision(RANK == 0) == (SIZE == 1)
    assert strategy.reduce_boolean_decision(RANK == 0, all=False)
    with pytest.raises(ValueError, match="reduce_op 'median'"):
        strategy.reduce(value, reduce_op="median")


def test_all_gather_with_gradients_sums_each_rows_gradient():
    strategy = trainer().strategy
    mine = torch.tensor([float(RANK + 1)], requires_grad=True)
    gathered = strategy.all_gather(mine, sync_grads=True)
    assert gathered.shape == (SIZE, 1)
    (gathered.squeeze(1) * torch.arange(1.0, SIZE + 1)).sum().backward()
    # Every rank's loss weighs this rank's row by RANK + 1: the sum over ranks is SIZE times.
    assert mine.grad.tolist() == [SIZE * (RANK + 1.0)]


def _shared_directory() -> str:
    import tempfile

    return hvd.broadcast_object(tempfile.mkdtemp(prefix="rank_lightning_") if RANK == 0 else None)


def test_checkpoint_written_by_rank_0_and_resumed_on_every_rank():
    x, y = data(steps=3)
    path = os.path.join(_shared_directory(), "one_epoch.ckpt")
    first = trainer(max_epochs=1)
    writes = []
    save = first.strategy.checkpoint_io.save_checkpoint
    first.strategy.checkpoint_io.save_checkpoint = lambda *a, **k: (writes.append(1), save(*a, **k))
    first.fit(Regression(seed=RANK, momentum=0.9), loader(x, y))
    first.save_checkpoint(path)
    assert hvd.allgather_object(len(writes)) == [1] + [0] * (SIZE - 1)
    # A fresh model per rank, resumed from the file: weights and momentum from epoch 1.
    resumed = Regression(seed=100 + RANK, momentum=0.9)
    trainer(max_epochs=2).fit(resumed, loader(x, y), ckpt_path=path)
    assert_same_parameters(resumed, reference(x, y, epochs=2, momentum=0.9))


def test_bf16_mixed_precision_trains_alike_on_every_rank():
    x, y = data(steps=3, dtype=torch.float32)
    model = Regression(seed=RANK, dtype=torch.float32)
    trainer(max_epochs=2, precision="bf16-mixed").fit(model, loader(x, y))
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert flat.dtype == torch.float32 and torch.isfinite(flat).all()
    assert all(torch.equal(flat, other) for other in hvd.allgather_object(flat))
    expected = reference(x.double(), y.double(), epochs=2)
    for got, want in zip(model.parameters(), expected.parameters()):
        # bf16 keeps 8 bits of mantissa: the run follows float64 to about 1e-2.
        torch.testing.assert_close(got.double(), want, rtol=0.05, atol=0.05)
