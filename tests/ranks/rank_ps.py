"""hvd.ps on every rank: the last ranks serve, the others train.

staleness=0 equals one process training on the whole batch (float64, 1e-9) with 1 and 2 servers,
a split dense layer, packed small ones and sparse embedding rows; asynchronous and bounded-
staleness training reach the synchronous accuracy on scikit-learn's digits within a margin; a
worker that starts late gets the current parameters and holds nobody back; every error is raised
on every rank before training. A worker that dies is tests/test_ps_jobs.py's (it needs
`mpiexec -disable-auto-cleanup`).

Every rank builds the same model and computes the single-process reference itself.
"""

import functools
import time

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
import horovodlite.torch as hvd  # noqa: E402

from horovodlite.training.ps.layout import SPLIT_ELEMENTS  # noqa: E402

F = torch.nn.functional
MARGIN = 0.05  # accuracy a non-synchronous run may lose against synchronous training on digits
STEPS = 150  # digits training steps


def server_counts():
    """The server counts to run at this size (each leaves at least one worker)."""
    return [s for s in (1, 2) if s < hvd.size()]


needs_two_ranks = pytest.mark.skipif(MPI.COMM_WORLD.size < 2, reason="a server and a worker")


class Net(torch.nn.Module):
    """A layer big enough to be split over servers, small ones packed, sparse embedding rows."""

    def __init__(self):
        super().__init__()
        width = int(np.sqrt(SPLIT_ELEMENTS)) + 4  # width**2 > SPLIT_ELEMENTS: split
        self.emb = torch.nn.Embedding(1000, 3, sparse=True)
        self.a, self.b = torch.nn.Linear(6, width), torch.nn.Linear(width, width)
        self.c = torch.nn.Linear(width + 3, 4)

    def forward(self, x, rows):
        h = torch.tanh(self.b(torch.tanh(self.a(x))))
        return self.c(torch.cat([h, self.emb(rows)], 1))


def make_net():
    torch.manual_seed(0)
    return Net().double()


def data(steps, rows):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(steps, rows, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 4, (steps, rows), generator=g)
    return x, y, torch.randint(0, 1000, (steps, rows), generator=g)


@needs_two_ranks
@pytest.mark.parametrize("servers", [1, 2])
def test_synchronous_equals_one_process_on_the_whole_batch(servers):
    if servers >= hvd.size():
        pytest.skip("no worker left")
    dense = functools.partial(torch.optim.Adam, lr=0.01)
    rows_opt = functools.partial(torch.optim.SGD, lr=0.5)
    net, reference = make_net(), make_net()
    job = hvd.ps.start(net, dense, servers=servers, staleness=0, sparse_optimizer=rows_opt)
    steps, workers = 4, hvd.size() - servers
    x, y, rows = data(steps, 3 * workers + 1)  # workers' shares differ by one row
    if job.is_server:
        report = job.serve()
        assert report["staleness_max"] == 0 and report["updates"] == steps
        return
    for t in range(steps):
        share = [a[t].tensor_split(workers)[hvd.rank()] for a in (x, y, rows)]
        # Weight each share so that the mean of the workers' losses is the whole batch's mean.
        scale = workers * len(share[0]) / len(x[t])
        (F.cross_entropy(net(share[0], share[2]), share[1]) * scale).backward()
        job.push()
    report = job.finish()
    assert report["staleness_histogram"] == [steps * workers * servers]
    one = dense([p for n, p in reference.named_parameters() if n != "emb.weight"])
    emb = rows_opt([reference.emb.weight])
    for t in range(steps):
        F.cross_entropy(reference(x[t], rows[t]), y[t]).backward()
        one.step(), emb.step(), one.zero_grad(), emb.zero_grad()
    for (name, got), want in zip(net.named_parameters(), reference.parameters()):
        assert torch.allclose(got, want, rtol=0, atol=1e-9), name


def digits():
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = datasets.load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    return x[:1400], torch.tensor(y[:1400]), x[1400:], torch.tensor(y[1400:])


def train_digits(staleness, late_ms=0):
    """Train an MLP on digits; return (test accuracy, report) on workers, (None, report) on
    servers."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    job = hvd.ps.start(net, functools.partial(torch.optim.SGD, lr=0.3),
                       servers=1, staleness=staleness)  # fmt: skip
    if job.is_server:
        return None, job.serve()
    x, y, x_test, y_test = digits()
    workers, batch = hvd.size() - 1, 60
    for t in range(STEPS):
        start = t * batch % len(x)
        xs, ys = (a[start : start + batch].tensor_split(workers)[hvd.rank()] for a in (x, y))
        F.cross_entropy(net(xs), ys).backward()
        job.push()
        if late_ms and hvd.rank() == 0:
            time.sleep(late_ms / 1000)  # a slow worker: the others do not wait (asynchronous)
    report = job.finish()
    with torch.no_grad():
        return (net(x_test).argmax(1) == y_test).float().mean().item(), report


@needs_two_ranks
def test_asynchronous_and_bounded_staleness_reach_the_synchronous_accuracy_on_digits():
    synchronous, _ = train_digits(0)
    asynchronous, report = train_digits(None, late_ms=5)
    bounded, bounded_report = train_digits(2, late_ms=5)
    if synchronous is None:
        return
    print(
        f"digits accuracy: synchronous {synchronous:.3f}, asynchronous {asynchronous:.3f}, "
        f"staleness 2 {bounded:.3f}"
    )
    assert synchronous > 0.8
    assert asynchronous >= synchronous - MARGIN, (asynchronous, synchronous)
    assert bounded >= synchronous - MARGIN, (bounded, synchronous)
    workers = hvd.size() - 1
    assert report["pushes"] == bounded_report["pushes"] == STEPS * workers
    # A push's staleness counts the others' updates in between: each other worker was at least
    # s steps behind at the pull and at most s + 1 ahead at the push: (workers - 1)(2s + 1).
    assert bounded_report["staleness_max"] <= (workers - 1) * 5


@pytest.mark.skipif(MPI.COMM_WORLD.size < 3, reason="a late worker and another one")
@pytest.mark.parametrize("staleness", [None, 1])
def test_a_late_worker_starts_from_the_current_parameters(staleness):
    """The last worker starts after the others did 4 steps (beyond the bound of 1)."""
    net = make_net()
    comm = MPI.COMM_WORLD.Dup()  # the test's own messages: "the others are ahead"
    job = hvd.ps.start(net, functools.partial(torch.optim.SGD, lr=0.1), servers=1,
                       staleness=staleness)  # fmt: skip
    late, others = hvd.size() - 2, range(hvd.size() - 2)
    x, y, rows = data(4, 2)
    if job.is_server:
        job.serve()
    elif hvd.rank() == late:
        for r in others:
            comm.recv(source=r, tag=5)  # every other worker's 4 pushes are applied
        start = [p.detach().clone() for p in net.parameters()]
        net(x[0], rows[0])  # the forward pulls
        assert job.client.versions == [4 * len(others)]
        assert not torch.equal(start[1], net.a.weight)
        F.cross_entropy(net(x[0], rows[0]), y[0]).backward()
        job.push()
        job.finish()
    else:
        for t in range(4):
            F.cross_entropy(net(x[t], rows[t]), y[t]).backward()
            job.push()
        job.pull()  # answered after this worker's last push was applied
        comm.send(None, dest=late, tag=5)
        job.finish()
    comm.Free()


def expect_everywhere(error, match, **kwargs):
    with pytest.raises(error, match=match):
        hvd.ps.start(**kwargs)


def test_no_worker_left_raises_on_every_rank():
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    expect_everywhere(ValueError, "leaves 0 workers", model=make_net(), optimizer=sgd,
                      servers=hvd.size())  # fmt: skip
    expect_everywhere(ValueError, "staleness", model=make_net(), optimizer=sgd, staleness=-1)


@needs_two_ranks
def test_an_optimizer_that_needs_a_closure_raises_on_every_rank():
    expect_everywhere(ValueError, "LBFGS needs a closure", model=make_net(),
                      optimizer=torch.optim.LBFGS)  # fmt: skip


@needs_two_ranks
def test_an_optimizer_without_sparse_rows_raises_on_every_rank():
    expect_everywhere(ValueError, "Adam cannot update the rows", model=make_net(),
                      optimizer=functools.partial(torch.optim.Adam, lr=0.1))  # fmt: skip


@needs_two_ranks
def test_parameters_that_differ_between_ranks_raise_on_every_rank():
    net = make_net()
    if hvd.rank() == 1:
        with torch.no_grad():
            net.b.bias[0] += 1
    expect_everywhere(ValueError, r"'b.bias' differs between ranks at start \(ranks \[1\]",
                      model=net, optimizer=functools.partial(torch.optim.SGD, lr=0.1))  # fmt: skip
