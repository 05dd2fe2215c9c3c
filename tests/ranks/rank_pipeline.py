"""hvd.pipeline.Pipeline on every rank: the loss, every gradient and 10 optimizer steps equal
single-process training on the same batch, for both schedules, with and without checkpointing,
uneven balance, tuple outputs, pipelines replicated over data-parallel sets; errors on every rank.

Every rank builds the same model and computes the single-process reference itself.
"""

import copy

import pytest

torch = pytest.importorskip("torch")
import horovodlite.torch as hvd  # noqa: E402

F = torch.nn.functional
ROWS, CHUNKS = 8, 4  # rows per pipeline replica; micro-batches of 2


class Split(torch.nn.Module):
    """Return a tuple: two float tensors and an integer one that needs no gradient."""

    def forward(self, x):
        return x[:, :4] * 2, torch.sin(x[:, 4:]), (x[:, 0] > 0).long()


class Merge(torch.nn.Module):
    def forward(self, parts):
        a, b, index = parts
        return torch.cat([a, b], dim=1) + index[:, None].float() * 0.01


def model(kind="mlp", layers=6):
    torch.manual_seed(0)
    if kind == "tuple":
        return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), Split(), Merge(),
                                   torch.nn.Linear(8, 3))  # fmt: skip
    body = [torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
            torch.nn.Linear(8, 6), torch.nn.Linear(6, 3)]  # fmt: skip
    return torch.nn.Sequential(*body[:layers])


def batch(step, replica, rows=ROWS):
    generator = torch.Generator().manual_seed(1000 * step + replica)
    return torch.randn(rows, 5, generator=generator), torch.randn(rows, 3, generator=generator)


def layouts():
    """(stages) to run at this size: every rank a stage, and replicated pipelines where possible."""
    size = hvd.size()
    return sorted({size, {1: 1, 2: 1, 3: 1, 4: 2}[size]}, reverse=True)


def reference_gradients(net, x, y):
    net = copy.deepcopy(net)
    loss = F.mse_loss(net(x), y)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in net.named_parameters()}


def check_step(pipe, net, step=0):
    x, y = batch(step, pipe.replica)
    pipe.zero_grad()
    loss = pipe.train_step(x, y, F.mse_loss)
    expected_loss, expected = reference_gradients(net, x, y)
    assert loss == pytest.approx(expected_loss, rel=1e-5, abs=1e-7)
    for name, param in pipe.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("uneven", [False, True])
def test_loss_and_gradients_equal_single_process(schedule, checkpoint, uneven):
    for stages in layouts():
        net = model()
        balance = [1] * (stages - 1) + [6 - stages + 1] if uneven else None
        pipe = hvd.pipeline.Pipeline(
            copy.deepcopy(net), CHUNKS, schedule, stages, balance, checkpoint=checkpoint
        )
        if uneven:
            assert pipe.balance == balance
        for step in range(2):  # the second step runs on the shapes cached by the first
            check_step(pipe, net, step)


def test_each_rank_holds_its_stages_layers_under_their_names():
    for stages in layouts():
        pipe = hvd.pipeline.Pipeline(model(), chunks=2, stages=stages, balance=None)
        first, stop = [0, *_cumulative(pipe.balance)][pipe.stage : pipe.stage + 2]
        expected = {f"{i}.{kind}" for i in range(first, stop) if i in (0, 2, 4, 5)
                    for kind in ("weight", "bias")}  # fmt: skip
        assert {name for name, _ in pipe.named_parameters()} == expected
        assert len(list(pipe.parameters())) == len(expected)
        assert pipe.pipeline_set.ranks == [pipe.replica * stages + s for s in range(stages)]
        assert pipe.data_parallel_set.ranks == list(range(pipe.stage, hvd.size(), stages))


def _cumulative(counts):
    total, out = 0, []
    for c in counts:
        total += c
        out.append(total)
    return out


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_tuple_outputs_travel_between_stages(schedule):
    # Cut right after Split wherever there are stages: a tuple with an integer tensor travels.
    balance = {1: [5], 2: [3, 2], 3: [3, 1, 1], 4: [1, 1, 1, 2]}[hvd.size()]
    net = model("tuple")
    pipe = hvd.pipeline.Pipeline(copy.deepcopy(net), chunks=CHUNKS, schedule=schedule,
                                 balance=balance, checkpoint=schedule == "gpipe")  # fmt: skip
    check_step(pipe, net)
    check_step(pipe, net, step=1)


def test_eval_step_returns_the_output_on_the_last_stage():
    for stages in layouts():
        net = model()
        pipe = hvd.pipeline.Pipeline(copy.deepcopy(net), chunks=CHUNKS, stages=stages)
        x, _ = batch(5, pipe.replica)
        out = pipe.eval_step(x)
        if pipe.is_last:
            torch.testing.assert_close(out, net(x).detach(), rtol=1e-5, atol=1e-6)
        else:
            assert out is None
        # Training after evaluation: a new step key, its own shapes (requires_grad differs).
        check_step(pipe, net)


def test_other_stages_may_pass_none():
    for stages in layouts():
        net = model()
        pipe = hvd.pipeline.Pipeline(copy.deepcopy(net), chunks=CHUNKS, stages=stages)
        x, y = batch(0, pipe.replica)
        loss = pipe.train_step(x if pipe.is_first else None, y if pipe.is_last else None,
                               F.mse_loss)  # fmt: skip
        assert loss == pytest.approx(reference_gradients(net, x, y)[0], rel=1e-5)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_ten_steps_with_distributed_optimizer_equal_single_process(schedule):
    for stages in layouts():
        net = model()
        pipe = hvd.pipeline.Pipeline(copy.deepcopy(net), chunks=CHUNKS, schedule=schedule,
                                     stages=stages)  # fmt: skip
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(pipe.parameters(), lr=0.1, momentum=0.9),
            named_parameters=pipe.named_parameters(),
            process_set=pipe.data_parallel_set,
        )
        reference = copy.deepcopy(net)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        replicas = hvd.size() // stages
        for step in range(10):
            optimizer.zero_grad()
            x, y = batch(step, pipe.replica)
            loss = pipe.train_step(x, y, F.mse_loss)
            optimizer.step()
            # Single process on every replica's batch at once: the mean over all rows.
            parts = [batch(step, r) for r in range(replicas)]
            whole_x, whole_y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            reference_optimizer.zero_grad()
            whole = F.mse_loss(reference(whole_x), whole_y)
            whole.backward()
            reference_optimizer.step()
            if replicas == 1:
                assert loss == pytest.approx(whole.item(), rel=1e-5)
        expected = dict(reference.named_parameters())
        for name, param in pipe.named_parameters():
            torch.testing.assert_close(param, expected[name], rtol=1e-5, atol=1e-5, msg=name)
        # The replicas differ in data, so the check above could see a missing all-reduce.
        assert replicas == 1 or any(
            not torch.equal(batch(0, 0)[0], batch(0, r)[0]) for r in range(1, replicas)
        )


# -- errors on every rank, before any message of the pipeline --------------------------------


def test_module_that_is_not_sequential():
    with pytest.raises(TypeError, match="Pipeline needs an nn.Sequential, got Linear"):
        hvd.pipeline.Pipeline(torch.nn.Linear(2, 2), chunks=2)


def test_fewer_layers_than_stages():
    if hvd.size() == 1:
        pytest.skip("one stage: any model has enough layers")
    with pytest.raises(ValueError, match=f"fewer than stages={hvd.size()}"):
        hvd.pipeline.Pipeline(model(layers=hvd.size() - 1), chunks=2)


def test_stages_that_do_not_divide_the_size():
    with pytest.raises(ValueError, match=f"stages={hvd.size() + 1} does not divide"):
        hvd.pipeline.Pipeline(model(), chunks=2, stages=hvd.size() + 1)


@pytest.mark.parametrize(
    "balance, kind, text",
    [("6", TypeError, "balance must hold ints"), ([1], ValueError, "one layer count per stage"),
     ("sum", ValueError, "adds up to")],
)  # fmt: skip
def test_bad_balance(balance, kind, text):
    stages = hvd.size()
    if balance == "sum":
        balance = [1] * stages
        balance[-1] += 1  # adds up to stages + 1, never 6 with at most 4 stages
    elif balance == [1] and stages == 1:
        balance = [3, 3]
    with pytest.raises(kind, match=text):
        hvd.pipeline.Pipeline(model(), chunks=2, balance=balance)


@pytest.mark.parametrize(
    "kwargs, text",
    [({"schedule": "zb"}, "schedule must be one of"), ({"chunks": 0}, "chunks must be"),
     ({"checkpoint": "yes"}, "checkpoint must be a bool")],
)  # fmt: skip
def test_bad_arguments(kwargs, text):
    arguments = {"chunks": 2, **kwargs}
    with pytest.raises((TypeError, ValueError), match=text):
        hvd.pipeline.Pipeline(model(), **arguments)


def test_arguments_that_differ_per_rank():
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(ValueError, match="passed different arguments to Pipeline"):
        hvd.pipeline.Pipeline(model(), chunks=2 if hvd.rank() == 0 else 4)


def test_batch_that_does_not_split_into_chunks():
    pipe = hvd.pipeline.Pipeline(model(), chunks=CHUNKS)
    x, y = batch(0, 0, rows=7)
    with pytest.raises(ValueError, match="7 rows does not split into chunks=4"):
        pipe.train_step(x, y, F.mse_loss)
    with pytest.raises(ValueError, match="7 rows does not split into chunks=4"):
        pipe.eval_step(x)
    check_step(pipe, model())  # still usable


def test_batch_that_differs_between_stages():
    if hvd.size() == 1:
        pytest.skip("needs two stages")
    pipe = hvd.pipeline.Pipeline(model(), chunks=2)
    x, y = batch(0, 0, rows=8 if hvd.rank() == 0 else 6)
    with pytest.raises(ValueError, match="stage 1 passed inputs of 6 rows, but stage 0 passed"):
        pipe.train_step(x, y, F.mse_loss)


def test_inputs_that_are_not_tensors():
    pipe = hvd.pipeline.Pipeline(model(), chunks=2)
    x, y = batch(0, 0)
    bad = x.tolist() if hvd.rank() == 0 else x
    with pytest.raises(TypeError, match="not a tensor or a tuple of tensors|expected a tensor"):
        pipe.train_step(bad, y, F.mse_loss)


class Dict(torch.nn.Module):
    def forward(self, x):
        return {"x": x}


@pytest.mark.parametrize("where", ["first", "last"])
def test_stage_output_that_is_not_a_tensor(where):
    stages = hvd.size()
    layers = [torch.nn.Linear(5, 5) for _ in range(stages)]
    layers.insert(1 if where == "first" else stages, Dict())  # the last layer of that stage
    balance = [2] + [1] * (stages - 1) if where == "first" else [1] * (stages - 1) + [2]
    pipe = hvd.pipeline.Pipeline(torch.nn.Sequential(*layers), chunks=2, balance=balance)
    x, _ = batch(0, 0)
    with pytest.raises(TypeError, match="returned dict: a stage's output .* must be a tensor"):
        pipe.train_step(x, x, F.mse_loss)


def test_loss_that_is_not_a_scalar():
    pipe = hvd.pipeline.Pipeline(model(), chunks=2)
    x, y = batch(0, 0)
    with pytest.raises(TypeError, match="loss_fn must return a scalar tensor"):
        pipe.train_step(x, y, lambda out, target: (out - target) ** 2)
    check_step(pipe, model())  # the failed first step left no message behind


# -- checkpointing -----------------------------------------------------------------------------


class SavedBytes:
    """Count the bytes of the tensors autograd saves for backward that are alive, and the peak."""

    def __init__(self, params):
        self.params = {p.data_ptr() for p in params}
        self.live = self.peak = 0

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda held: held.tensor)

    def pack(self, tensor):
        counted = 0 if tensor.data_ptr() in self.params else tensor.numel() * tensor.element_size()
        return _Held(self, tensor, counted)


class _Held:
    def __init__(self, counter, tensor, counted):
        self.counter, self.tensor, self.counted = counter, tensor, counted
        counter.live += counted
        counter.peak = max(counter.peak, counter.live)

    def __del__(self):
        self.counter.live -= self.counted


def test_checkpoint_holds_one_micro_batch_and_replays_dropout():
    def run(checkpoint):
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16),
                                                        torch.nn.Dropout(0.5))
                                    for _ in range(hvd.size())])  # fmt: skip
        pipe = hvd.pipeline.Pipeline(net, chunks=8, schedule="gpipe", checkpoint=checkpoint)
        counter = SavedBytes(pipe.parameters())
        x = torch.randn(32, 16)
        pipe.train_step(x, x, F.mse_loss)  # the first step of a shape keeps F(0)'s graph
        pipe.zero_grad()
        torch.manual_seed(1)  # the same dropout masks in both runs, unless a replay differs
        with counter.hooks():
            pipe.train_step(x, x, F.mse_loss)
        return counter.peak, [p.grad for p in pipe.parameters()]

    kept, grads = run(False)
    replayed, checkpointed_grads = run(True)
    # GPipe keeps all 8 micro-batches' activations; checkpointing keeps one at a time.
    assert kept > 0 and replayed * 8 == kept, (kept, replayed)
    for grad, expected in zip(checkpointed_grads, grads):
        torch.testing.assert_close(grad, expected, rtol=0, atol=0)
