"""DistributedOptimizer.synchronize() on ResNet-50's 161 gradients, three ways side by side.

- new grads: each step gives every parameter a new gradient (a clone, as backward makes after
  the default zero_grad()), then synchronize();
- kept grads: zero_grad(set_to_none=False), then each gradient accumulates in place (add_, as
  backward does into a kept gradient), then synchronize();
- one buffer: one allreduce of the same bytes.

Both step kinds include their own gradient work (the clone, or the zero and the add), as a
training step would. Run from outside the repository for the code before a change:
    mpiexec -n 2 python benchmarks/results/quiet_27d/optimizer_paths.py
    PYTHONPATH=<a copy of that revision's horovodlite/ with bindings/* as horovodlite/*> ...
Prints one RESULT line of medians (ms) over 7 rounds, the slowest rank's time.
"""

import json
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/
import horovodlite.torch as hvd  # noqa: E402
from engine_fusion import RESNET50_SHAPES, timed  # noqa: E402

import horovodlite as core  # noqa: E402

hvd.init()
rng = np.random.default_rng(hvd.rank())
grads = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in RESNET50_SHAPES]


def optimizer_step(keep: bool):
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    named = [(f"{keep}.{i}", p) for i, p in enumerate(params)]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=named)

    def step():
        if keep and params[0].grad is not None:
            optimizer.zero_grad(set_to_none=False)
            for p, g in zip(params, grads):
                p.grad.add_(g)
        else:
            for p, g in zip(params, grads):
                p.grad = g.clone()
        optimizer.synchronize()

    step()  # the first step records the gradients' order
    return step


flat = torch.from_numpy(np.concatenate([g.numpy().reshape(-1) for g in grads]))
methods = {
    "new grads": optimizer_step(False),
    "kept grads": optimizer_step(True),
    "one buffer": lambda: hvd.allreduce(flat, name="flat"),
}
times: dict = {name: [] for name in methods}
for _ in range(7):
    for name, step in methods.items():
        times[name].append(timed(core, step))
if hvd.rank() == 0:
    medians = {name: float(np.median(t) * 1e3) for name, t in times.items()}
    print("RESULT", json.dumps({"ranks": hvd.size(), **medians}))
