"""At one rank: 161 torch tensors, async and fused by the engine against one sync call each.

    HOROVODLITE_TRANSPORT=gloo python one_rank_fused.py small   # 161 x 256 float32 (all 1-D)
    HOROVODLITE_TRANSPORT=gloo python one_rank_fused.py         # ResNet-50's gradient shapes

30 rounds, the two in turns; prints the medians in ms and the engine's cycles per fused pass.
"""

import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # benchmarks/
import horovodlite.torch as hvd  # noqa: E402
from engine_fusion import RESNET50_SHAPES  # noqa: E402

import horovodlite  # noqa: E402


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    small = sys.argv[1:] == ["small"]
    grads = [torch.randn((256,) if small else shape) for shape in RESNET50_SHAPES]
    engine = horovodlite.state.current().engine

    def fused():
        handles = [hvd.allreduce_async_(g, name=f"g{i}") for i, g in enumerate(grads)]
        for handle in handles:
            hvd.synchronize(handle)

    def one():
        for i, g in enumerate(grads):
            hvd.allreduce_(g, name=f"g{i}")

    times, cycles = {"fused": [], "one": []}, []
    fused(), one()
    for _ in range(30):
        for name, step in (("fused", fused), ("one", one)):
            before, start = engine.cycles, time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
            if name == "fused":
                cycles.append(engine.cycles - before)
    medians = {name: round(statistics.median(t) * 1e3, 3) for name, t in times.items()}
    print(medians, "cycles", statistics.median(cycles), os.environ.get("HOROVODLITE_TRANSPORT"))
    hvd.shutdown()


if __name__ == "__main__":
    main()
