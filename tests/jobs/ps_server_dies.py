"""The parameter server dies (os._exit) while the workers train: each worker raises a clear error.

Run under `mpiexec -disable-auto-cleanup` (so the job is not torn down at the death itself).
"""

import functools
import os
import threading

import horovodlite.torch as hvd
import torch

from horovodlite import HorovodLiteError

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
job = hvd.ps.start(model, functools.partial(torch.optim.SGD, lr=0.01), servers=1)
if job.is_server:
    threading.Timer(1.0, lambda: os._exit(3)).start()  # dies while serving
    job.serve()
else:
    try:
        for _ in range(1_000_000):  # until the server is gone
            model(torch.randn(8, 4)).pow(2).mean().backward()
            job.push()
    except HorovodLiteError as e:
        print(f"worker {hvd.rank()}: HorovodLiteError: {e}", flush=True)
        os._exit(1)  # MPI_Finalize would wait for the dead server
