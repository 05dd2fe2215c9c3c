"""Worker rank 1 dies (os._exit) mid-training; the server and the other workers go on.

argv: servers, staleness ("none" or an int). Run under `mpiexec -disable-auto-cleanup`.
"""

import functools
import os
import sys

import horovodlite.torch as hvd
import torch

hvd.init()
servers, staleness = int(sys.argv[1]), None if sys.argv[2] == "none" else int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
job = hvd.ps.start(model, functools.partial(torch.optim.SGD, lr=0.05), servers, staleness)
if job.is_server:
    report = job.serve()
    print(f"server {hvd.rank()} done: dead workers {sorted(report['dead_workers'])}", flush=True)
else:
    generator = torch.Generator().manual_seed(hvd.rank())
    for step in range(30):
        if hvd.rank() == 1 and step == 5:
            os._exit(3)  # no shutdown, no finalize: as a crash
        x = torch.randn(16, 4, generator=generator)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        job.push()
    report = job.finish()
    print(
        f"worker {hvd.rank()} finished 30 steps: dead workers {report['dead_workers']}", flush=True
    )
