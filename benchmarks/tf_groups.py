"""Time grouped all-reduces inside a tf.function: what num_groups/groups would cost in TF.

horovodlite's DistributedGradientTape sends every gradient of a step as one op. This times that
against the same gradients split into 4 groups (4 ops) and into one op per gradient, to show
what honouring Horovod's `num_groups`/`groups` would change (docs/tensorflow.md).

    mpiexec -n 2 python benchmarks/tf_groups.py

Prints, on rank 0, the slowest rank's median time per call of each variant.
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import horovodlite.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

COUNT, ELEMENTS, BLOCKS, CALLS = 16, 65536, 6, 10  # 16 float32 gradients of 256 KiB


def variant(groups):
    @tf.function
    def step(grads):
        out = []
        for members in groups:
            out += hvd.grouped_allreduce([grads[i] for i in members])
        return out

    return step


def main():
    hvd.init()
    grads = [tf.random.normal([ELEMENTS], seed=i) for i in range(COUNT)]
    variants = {
        "one op (num_groups=0)": variant([list(range(COUNT))]),
        "4 groups": variant([list(range(i, COUNT, 4)) for i in range(4)]),
        f"{COUNT} ops": variant([[i] for i in range(COUNT)]),
    }
    for step in variants.values():
        for _ in range(5):  # trace, then warm up the engine's name cache
            step(grads)
    times = {name: [] for name in variants}
    for _ in range(BLOCKS):  # take turns in blocks, so a change of load hits every variant
        for name, step in variants.items():
            hvd.barrier()
            start = time.perf_counter()
            for _ in range(CALLS):
                step(grads)
            times[name].append((time.perf_counter() - start) / CALLS)
    for name, samples in times.items():
        slowest = max(hvd.allgather_object(float(np.median(samples))))
        if hvd.rank() == 0:
            print(f"{name}: {slowest * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
