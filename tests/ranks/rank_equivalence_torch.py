"""Training at n ranks ends where one process ends on the whole batch (docs/equivalence.md).

Every rank starts from a model of its own (seeded by its rank), does the documented broadcasts
(broadcast_parameters, broadcast_optimizer_state) and trains on its part of each global batch;
every rank also trains the single-process oracle, from rank 0's initial model, on the whole
batch. They must agree to 1e-9 in float64, for every optimizer in torch.optim, through
DistributedOptimizer (backward_passes_per_step 1 and 2) and ZeroOptimizer (stages 1 and 2), and
after a resume from a checkpoint that rank 0 saved mid-training.

Hypothesis draws the examples (model sizes, batch splits, optimizer settings) derandomized, so
every rank draws the same ones; each rank's verdict is agreed across the ranks before it is
asserted, so that hypothesis goes on (or shrinks) alike everywhere.
"""

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import horovodlite.torch as hvd  # noqa: E402

TOLERANCE = 1e-9
RATES = [0.01, 0.1]


def optimizer_options(name: str, lr: float, decay: bool, momentum: bool) -> dict:
    """Return `name`'s keyword arguments: weight decay and momentum where it has them."""
    wd = 0.05 if decay else 0.0
    mom = 0.9 if momentum else 0.0
    return {
        "SGD": dict(lr=lr, momentum=mom, weight_decay=wd, dampening=0.1 if momentum else 0.0),
        "Adam": dict(lr=lr, weight_decay=wd, amsgrad=momentum),
        "AdamW": dict(lr=lr, weight_decay=wd),
        "Adamax": dict(lr=lr, weight_decay=wd),
        "NAdam": dict(lr=lr, weight_decay=wd, momentum_decay=0.004),
        "RAdam": dict(lr=lr, weight_decay=wd),
        "RMSprop": dict(lr=lr, weight_decay=wd, momentum=mom, centered=momentum),
        "Adagrad": dict(lr=lr, weight_decay=wd, initial_accumulator_value=0.1),
        "Adadelta": dict(lr=10 * lr, weight_decay=wd),
        "ASGD": dict(lr=lr, weight_decay=wd, t0=1),
        "Rprop": dict(lr=lr),
        "Adafactor": dict(lr=lr, weight_decay=wd),
        "Muon": dict(lr=lr, weight_decay=wd, momentum=mom or 0.5),
        "SparseAdam": dict(lr=lr),
    }[name]


DENSE = ["SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
         "ASGD", "Rprop", "Adafactor", "Muon"]  # fmt: skip
# ZeroOptimizer shards the elementwise ones (Adafactor factors, Muon orthogonalises matrices).
ZERO = [name for name in DENSE if name not in ("Adafactor", "Muon")]


class Sparse(torch.nn.Module):
    """An embedding with sparse gradients (SparseAdam takes nothing else), read by ids."""

    def __init__(self, sizes: tuple):
        super().__init__()
        self.embedding = torch.nn.Embedding(sizes[0] + 2, sizes[1], sparse=True)

    def forward(self, x):
        return self.embedding(x[:, 0].long()).sum(dim=1, keepdim=True)


def make_model(optimizer: str, sizes: tuple, seed: int) -> torch.nn.Module:
    """Return a float64 model of the given sizes, initialised from `seed`."""
    torch.manual_seed(seed)
    if optimizer == "SparseAdam":
        return Sparse(sizes).double()
    inputs, hidden, outputs = sizes
    bias = optimizer != "Muon"  # Muon updates matrices only
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden, bias=bias), torch.nn.Tanh(),
        torch.nn.Linear(hidden, outputs, bias=bias),
    ).double()  # fmt: skip


def batches(example: dict, ranks: int) -> list:
    """Return the global batches: one (x, y) per step, each the concatenation of every rank's."""
    generator = torch.Generator().manual_seed(example["seed"])
    total = sum(example["split"][:ranks])
    inputs, _, outputs = example["sizes"]
    if example["optimizer"] == "SparseAdam":
        inputs, outputs = 1, 1
    result = []
    for _ in range(example["steps"]):
        x = torch.randn(total, inputs, generator=generator, dtype=torch.float64)
        if example["optimizer"] == "SparseAdam":
            x = torch.randint(0, example["sizes"][0] + 2, (total, 1), generator=generator)
        y = torch.randn(total, outputs, generator=generator, dtype=torch.float64)
        result.append((x, y))
    return result


def loss_of(model, x, y, scale: float):
    """The squared error summed over the samples, times `scale`."""
    return ((model(x) - y) ** 2).sum() * scale


def new_optimizer(example: dict, model):
    name = example["optimizer"]
    options = optimizer_options(name, example["lr"], example["decay"], example["momentum"])
    return getattr(torch.optim, name)(model.parameters(), **options)


def single_process(example: dict, ranks: int) -> list:
    """Train one process on the whole batches from rank 0's initial model; return the params."""
    model = make_model(example["optimizer"], example["sizes"], example["seed"])
    optimizer = new_optimizer(example, model)
    for x, y in batches(example, ranks):
        optimizer.zero_grad()
        loss_of(model, x, y, 1.0 / len(x)).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def wrap(example: dict, model, optimizer):
    if example["wrapper"] == "distributed":
        return hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            backward_passes_per_step=example["passes"],
        )  # fmt: skip
    return hvd.ZeroOptimizer(
        optimizer, named_parameters=model.named_parameters(), stage=example["stage"],
        backward_passes_per_step=example["passes"], bucket_cap_mb=example["bucket_bytes"] / 2**20,
    )  # fmt: skip


def start(example: dict, resume: bool = False, checkpoint: bytes = b""):
    """Build this rank's model and optimizer (its own initial values), load, then broadcast.

    When `resume`, rank 0 loads `checkpoint` (what it saved), as after a restart.
    """
    r = hvd.rank()
    model = make_model(example["optimizer"], example["sizes"], example["seed"] + 1000 * r)
    optimizer = wrap(example, model, new_optimizer(example, model))
    if resume:
        zero = example["wrapper"] == "zero"
        # A ZeroOptimizer keeps only its shard of what it loads: every rank loads the file.
        if zero:
            checkpoint = hvd.broadcast_object(checkpoint, root_rank=0, name="checkpoint")
        if r == 0 or zero:
            saved = torch.load(io.BytesIO(checkpoint))
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return model, optimizer


def distributed(example: dict) -> list:
    """Train at this job's size, each rank on its part of every batch; return the params."""
    r, n = hvd.rank(), hvd.size()
    split = example["split"][:n]
    lo, hi = sum(split[:r]), sum(split[: r + 1])
    total = sum(split)
    model, optimizer = start(example)
    for step, (x, y) in enumerate(batches(example, n)):
        if step == example["resume_at"]:
            state = optimizer.state_dict()  # a collective for ZeroOptimizer
            buffer = io.BytesIO()
            if r == 0:
                torch.save({"model": model.state_dict(), "optimizer": state}, buffer)
            model, optimizer = start(example, resume=True, checkpoint=buffer.getvalue())
        optimizer.zero_grad()
        # Averaged over n ranks, n/total times each rank's sum is the mean over the whole batch
        # whatever the split; the micro-batches' losses add up to it.
        mine_x, mine_y = x[lo:hi], y[lo:hi]
        parts = torch.arange(len(mine_x)).tensor_split(example["passes"])
        for part in parts:
            loss_of(model, mine_x[part], mine_y[part], n / total).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def largest_difference(example: dict) -> float:
    """Return the largest difference from one process over every rank (the same on all)."""
    got = distributed(example)
    want = single_process(example, hvd.size())
    mine = max((float((g - w).abs().max()) for g, w in zip(got, want) if g.numel()), default=0.0)
    return max(hvd.allgather_object(mine, name="equivalence.difference"))


@st.composite
def examples(draw, optimizers: list, wrapper: str) -> dict:
    steps = draw(st.integers(2, 4))
    optimizer = draw(st.sampled_from(optimizers))
    return {
        "optimizer": optimizer,
        "wrapper": wrapper,
        "stage": draw(st.sampled_from([1, 2])),
        "passes": draw(st.sampled_from([1, 2])),
        "sizes": (draw(st.integers(1, 4)), draw(st.integers(1, 6)), draw(st.integers(1, 3))),
        # Uneven per-rank batches (the first four ranks' sizes; a job uses the first n).
        "split": draw(st.lists(st.integers(1, 4), min_size=4, max_size=4)),
        "steps": steps,
        "resume_at": draw(st.sampled_from([None, *range(1, steps)])),
        "lr": draw(st.sampled_from(RATES)),
        "decay": draw(st.booleans()),
        "momentum": draw(st.booleans()),
        "bucket_bytes": draw(st.sampled_from([64, 2**20])),  # 8 float64s: buckets cut params
        "seed": draw(st.integers(0, 2**16)),
    }


# Derandomized: every rank draws the same examples in the same order.
FEW = settings(max_examples=8, derandomize=True, database=None, deadline=None,
               suppress_health_check=list(HealthCheck), print_blob=False)  # fmt: skip


@pytest.mark.parametrize("name", DENSE + ["SparseAdam"])
def test_every_optimizer_matches_one_process(name):
    for passes in (1, 2):
        example = {
            "optimizer": name, "wrapper": "distributed", "stage": 1, "passes": passes,
            "sizes": (3, 4, 2), "split": [2, 3, 1, 4], "steps": 3, "resume_at": None,
            "lr": 0.1, "decay": True, "momentum": True, "bucket_bytes": 64, "seed": 7,
        }  # fmt: skip
        assert largest_difference(example) <= TOLERANCE


@pytest.mark.parametrize("name", ZERO)
def test_every_optimizer_matches_one_process_in_zero(name):
    for stage in (1, 2):
        example = {
            "optimizer": name, "wrapper": "zero", "stage": stage, "passes": 1,
            "sizes": (3, 4, 2), "split": [2, 3, 1, 4], "steps": 3, "resume_at": 2,
            "lr": 0.1, "decay": True, "momentum": True, "bucket_bytes": 64, "seed": 8,
        }  # fmt: skip
        assert largest_difference(example) <= TOLERANCE


@FEW
@given(examples(DENSE + ["SparseAdam"], "distributed"))
def test_distributed_optimizer_trains_as_one_process(example):
    assert largest_difference(example) <= TOLERANCE, example


@FEW
@given(examples(ZERO, "zero"))
def test_zero_optimizer_trains_as_one_process(example):
    assert largest_difference(example) <= TOLERANCE, example


# -- broadcast_optimizer_state --------------------------------------------------------------


def fresh(name: str, seed: int):
    """A model and a new optimizer of class `name` (LBFGS and SparseAdam included)."""
    model = make_model(name, (3, 4, 2), seed)
    options = {"LBFGS": dict(lr=0.1)}.get(name) or optimizer_options(name, 0.1, True, True)
    return model, getattr(torch.optim, name)(model.parameters(), **options)


def same_state(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            if not isinstance(y, dict) or not same_state(x, y):
                return False
        elif torch.is_tensor(x):
            if not torch.is_tensor(y) or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "distributed"])
@pytest.mark.parametrize("name", DENSE + ["SparseAdam", "LBFGS"])
def test_broadcast_leaves_a_new_optimizer_new(name, wrapped):
    model, optimizer = fresh(name, seed=hvd.rank())
    _, untouched = fresh(name, seed=hvd.rank())
    if wrapped:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    # No step taken, so no state (Adagrad's initial sums excepted, which every rank has alike).
    assert same_state(optimizer.state_dict()["state"], untouched.state_dict()["state"])
    # As Horovod's: every trained parameter has a zero gradient that can be broadcast at once.
    for param in model.parameters():
        assert param.grad is not None and not param.grad.to_dense().any()
        hvd.broadcast(param.grad.to_dense(), root_rank=0, name=f"fresh.grad.{name}")


@pytest.mark.parametrize("name", ["SGD", "Adam", "RMSprop", "Rprop", "Adagrad", "SparseAdam"])
def test_broadcast_gives_every_rank_the_roots_state(name):
    r = hvd.rank()
    model, optimizer = fresh(name, seed=0)
    if r == 0:  # only the root has stepped (a checkpoint it loaded, say)
        x = torch.tensor([[0.5, 1.0, 2.0]], dtype=torch.float64)
        loss_of(model, x, torch.ones(1, 1 if name == "SparseAdam" else 2).double(), 1.0).backward()
        optimizer.step()
    optimizer.param_groups[0]["lr"] = 0.1 + r  # hyper-parameters travel too
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert optimizer.param_groups[0]["lr"] == 0.1
    state = optimizer.state_dict()["state"]
    flat = {k: {s: v.tolist() if torch.is_tensor(v) else v for s, v in e.items()}
            for k, e in state.items()}  # fmt: skip
    everyone = hvd.allgather_object(flat, name=f"root.state.{name}")
    assert all(theirs == everyone[0] for theirs in everyone)
    assert state  # the root's state arrived


def test_broadcast_resets_a_rank_the_root_does_not_match():
    model, optimizer = fresh("Adam", seed=0)
    if hvd.rank() > 0:  # other ranks have stepped, the root is new: they become new too
        model(torch.ones(1, 3, dtype=torch.float64)).sum().backward()
        optimizer.step()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert optimizer.state_dict()["state"] == {}


def test_zero_optimizer_state_loaded_on_the_root_alone_is_an_error():
    if hvd.size() == 1:
        pytest.skip("needs ranks without the checkpoint")
    model, optimizer = fresh("Adam", seed=0)
    zero = hvd.ZeroOptimizer(optimizer, named_parameters=model.named_parameters())
    full = zero.state_dict()
    if hvd.rank() == 0:
        full["state"] = {i: {"step": torch.tensor(3.0), "exp_avg": torch.zeros_like(p),
                             "exp_avg_sq": torch.zeros_like(p)}
                         for i, p in enumerate(model.parameters())}  # fmt: skip
        zero.load_state_dict(full)
    with pytest.raises(ValueError, match="load_state_dict.. with the full checkpoint on every"):
        hvd.broadcast_optimizer_state(zero, root_rank=0)


@pytest.mark.parametrize("stage", [1, 2])
def test_broadcast_leaves_a_new_zero_optimizer_new(stage):
    model, optimizer = fresh("AdamW", seed=0)
    zero = hvd.ZeroOptimizer(optimizer, named_parameters=model.named_parameters(), stage=stage)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):  # the second finds what the first loaded: still no state
        hvd.broadcast_optimizer_state(zero, root_rank=0)
    assert zero.state_dict()["state"] == {}
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


def horovods_broadcast(optimizer, root_rank):
    """Horovod's broadcast_optimizer_state: a new optimizer first steps on zero gradients."""
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = torch.zeros_like(param)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    param.grad = param.grad.to_sparse()
        with optimizer.skip_synchronize():
            optimizer.step()
    broadcast_optimizer_state(optimizer, root_rank)


def measure() -> None:
    """Print the largest difference from one process per optimizer, Horovod's way and ours."""
    example = {
        "wrapper": "distributed", "stage": 1, "passes": 1, "sizes": (3, 4, 2),
        "split": [2, 3, 1, 4], "steps": 3, "lr": 0.1, "decay": True, "momentum": True,
        "bucket_bytes": 64, "seed": 7,
    }  # fmt: skip
    for name in DENSE + ["SparseAdam"]:
        row = []
        for way in (horovods_broadcast, hvd.broadcast_optimizer_state):
            for resume_at in (None, 2):
                hvd.broadcast_optimizer_state = way
                row.append(largest_difference({**example, "optimizer": name,
                                               "resume_at": resume_at}))  # fmt: skip
                hvd.broadcast_optimizer_state = broadcast_optimizer_state
        if hvd.rank() == 0:
            print(f"{name:10} Horovod's {row[0]:.1e} (resumed {row[1]:.1e}), "
                  f"horovodlite's {row[2]:.1e} (resumed {row[3]:.1e})", flush=True)  # fmt: skip


broadcast_optimizer_state = hvd.broadcast_optimizer_state

if __name__ == "__main__":  # mpiexec -n N python tests/ranks/rank_equivalence_torch.py
    hvd.init()
    measure()
    hvd.shutdown()
