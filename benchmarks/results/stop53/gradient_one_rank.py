"""At one rank over Gloo: a differentiable all-reduce (Sum) of 256 float32 values, forward and
backward; best of 5 timeit blocks, µs a call. Nothing moves at one rank: this is horovodlite's
own cost of the two passes. (SyncBatchNorm is plain BatchNorm at one rank: not timed here.)

    HOROVODLITE_TRANSPORT=gloo python gradient_one_rank.py
"""

import os
import timeit

import horovodlite.torch as hvd
import torch


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    x = torch.randn(256, requires_grad=True)

    def step():
        hvd.allreduce(x, op=hvd.Sum, name="x").sum().backward()

    n = 2000
    best = min(timeit.repeat(step, number=n, repeat=5)) / n * 1e6
    print("GRADIENT", os.environ.get("PYTHONPATH") or "new", f"allreduce {best:.1f} us", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
