"""At one rank over Gloo, the engine's Python a torch gradient, in three parts:

    HOROVODLITE_TRANSPORT=gloo python per_gradient.py

  plan     tensor_allreduce_plan() of a repeated in-place all-reduce (timeit, best of 5);
  submit   allreduce_async_() of each of 161 tensors of 256 float32 (named as a training step
           names them), a step's median over 200 steps, per gradient; then synchronize();
  pass     the engine's fused pass over those 161 (fused_allreduce: join, split; at one rank
           nothing moves), timeit, best of 5.
"""

import os
import statistics
import time
import timeit

import horovodlite.torch as hvd
import torch
from horovodlite.torch import mpi_ops
from horovodlite.torch.tensors import TORCH_TENSORS

from horovodlite import fusion, tensor_plans


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    grads = [torch.randn(256) for _ in range(161)]
    args = mpi_ops.reduce_kwargs(None, None, 1.0, 1.0, hvd.global_process_set)

    def plan():
        return tensor_plans.tensor_allreduce_plan(grads[0], TORCH_TENSORS, "g0", True, args)

    n = 100000
    plan_us = min(timeit.repeat(plan, number=n, repeat=5)) / n * 1e6
    submit = []
    for _ in range(200):
        start = time.perf_counter()
        handles = [hvd.allreduce_async_(g, name=f"g{i}") for i, g in enumerate(grads)]
        submit.append(time.perf_counter() - start)
        for handle in handles:
            hvd.synchronize(handle)
    plans = [tensor_plans.tensor_allreduce_plan(g, TORCH_TENSORS, f"g{i}", True, args)
             for i, g in enumerate(grads)]  # fmt: skip
    entries, comm = [p.fusion for p in plans], plans[0].comm
    n = 300
    pass_us = min(timeit.repeat(lambda: fusion.fused_allreduce(comm, entries), number=n,
                                repeat=5)) / n * 1e6  # fmt: skip
    tree = os.environ.get("PYTHONPATH") or "new"
    print("PERGRADIENT", tree, f"plan {plan_us:.2f} us,",
          f"submit {statistics.median(submit) / len(grads) * 1e6:.2f} us a gradient,",
          f"pass {pass_us:.1f} us", flush=True)  # fmt: skip
    hvd.shutdown()


if __name__ == "__main__":
    main()
