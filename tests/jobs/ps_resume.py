"""A parameter server is killed mid-training; the job resumes from the servers' last checkpoint.

argv: servers, steps, checkpoint_every, kill_at, how. Run under `horovodlite-run
--parameter-servers --min-np N --max-np N`. On the first run the last server dies at update
`kill_at`: `how` = "kill": worker 0 SIGKILLs it before its step `kill_at` (MPICH's launcher then
ends the job, -disable-auto-cleanup or not); "exit": the server leaves with os._exit before it
applies update `kill_at` + 1, and every worker raises a clear error. Either way the launcher
starts the job again, which resumes from the servers' newest common checkpoint and trains to
the end.

Synchronous (staleness=0) in float64 with Adam, so the job equals one process training on the
combined batch (rank_ps.py checks that): at resume the parameters must equal that process's
after the checkpoint's steps, and at the end after every step, which needs Adam's moments to
have come back from the checkpoint too.
"""

import functools
import os
import signal
import sys

import horovodlite.torch as hvd
import torch

ROWS = 3  # per worker step

hvd.init()
servers, steps, every, kill_at = map(int, sys.argv[1:5])
how = sys.argv[5]
restart = int(os.environ.get("HOROVODLITE_ELASTIC_RESTART", "0"))
workers = hvd.size() - servers
adam = functools.partial(torch.optim.Adam, lr=0.05)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 1)).double()  # fmt: skip


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(workers * ROWS, 4, generator=g, dtype=torch.float64)
    return x, x.sum(1, keepdim=True).sin()


def reference(count):
    """One process, the whole batch of each step, `count` steps."""
    model = make_model()
    opt = adam(model.parameters())
    for step in range(count):
        x, y = batch(step)
        opt.zero_grad()
        (model(x) - y).pow(2).mean().backward()
        opt.step()
    return model


def difference(model, count):
    ref = reference(count)
    return max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))


model = make_model()
job = hvd.ps.start(model, adam, servers=servers, staleness=0, checkpoint_every=every)
if job.is_server:
    if restart == 0 and how == "exit" and hvd.rank() == hvd.size() - 1:
        apply = job.apply  # the update the server loop calls: die before update kill_at + 1

        def apply_or_die(dense, sparse):
            if job.loop.version == kill_at:
                os._exit(3)
            apply(dense, sparse)

        job.apply = apply_or_die
    job.serve()
else:
    rank = hvd.rank()
    job.pull()
    print(f"run {restart} worker {rank}: starts at step {job.step} (checkpoint "
          f"{job.resumed_from}), parameters off one process's by "
          f"{difference(model, job.step):.1e}", flush=True)  # fmt: skip
    for step in range(job.step, steps):
        if restart == 0 and how == "kill" and rank == 0 and step == kill_at:
            last_server = hvd.size() - 1
            os.kill(job.client.peers[last_server].pid, signal.SIGKILL)
        x, y = batch(step)
        mine = slice(rank * ROWS, (rank + 1) * ROWS)
        (model(x[mine]) - y[mine]).pow(2).mean().backward()
        job.push()
    job.finish()
    print(f"run {restart} worker {rank}: finished {steps} steps, parameters off one process's "
          f"by {difference(model, steps):.1e}", flush=True)  # fmt: skip
