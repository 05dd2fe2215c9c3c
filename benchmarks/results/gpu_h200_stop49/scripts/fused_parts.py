"""Where ResNet-50's 161 fused async gradients spend their time on the GPU, at 1 rank: with
PARTS_PROFILE=0, the caller's submit loop (allreduce_async_) against the whole pass; with
PARTS_CORE=1, through the core on CuPy views made once. PARTS_PROFILE=1 (the default) would
cProfile the caller and the engine thread, which Python 3.12 refuses (one profiler per process):
the runs used PARTS_PROFILE=0. Usage: mpiexec -n 1 python3 fused_parts.py OUTDIR"""

import cProfile
import os
import pstats
import statistics
import sys
import time

import horovodlite.torch as hvd
import torch
import torchvision

from horovodlite import engine as E

out = sys.argv[1] if len(sys.argv) > 1 else "."
PROFILE = os.environ.get("PARTS_PROFILE", "1") == "1"
engine_prof = cProfile.Profile()
_run = E.Engine._run


def _profiled_run(self):
    if PROFILE:
        engine_prof.enable()
    try:
        _run(self)
    finally:
        engine_prof.disable()


E.Engine._run = _profiled_run

hvd.init()
DEV = os.environ.get("PARTS_DEV", "cuda")
if DEV == "cuda":
    torch.cuda.set_device(0)


def cuda_sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


grads = [torch.randn(p.shape, device=DEV) for p in torchvision.models.resnet50().parameters()]
if os.environ.get("PARTS_CORE") == "1":
    # The core alone, on the binding's CuPy (or numpy) views made once: what the binding adds
    # per request is the difference.
    from horovodlite.torch.tensors import TensorView

    import horovodlite as core

    views = [TensorView(g).array for g in grads]

    def submit():
        return [core.allreduce_async_(v, name=f"g{i}") for i, v in enumerate(views)]

    def wait(hs):
        for h in hs:
            core.synchronize(h)
else:

    def submit():
        return [hvd.allreduce_async_(g, name=f"g{i}") for i, g in enumerate(grads)]

    def wait(hs):
        for h in hs:
            hvd.synchronize(h)


for _ in range(3):
    wait(submit())
cuda_sync()
if PROFILE:
    main_prof = cProfile.Profile()
    main_prof.enable()
    for _ in range(30):
        wait(submit())
    main_prof.disable()
    hvd.shutdown()
    for name, p in (("main", main_prof), ("engine", engine_prof)):
        with open(os.path.join(out, f"prof_fused_{name}.txt"), "w") as f:
            s = pstats.Stats(p, stream=f)
            s.sort_stats("tottime").print_stats(45)
            s.sort_stats("cumulative").print_stats(45)
    print("PARTS profiles written", flush=True)
    sys.exit()
sub, tot = [], []
for _ in range(30):
    cuda_sync()
    t0 = time.perf_counter()
    hs = submit()
    t1 = time.perf_counter()
    wait(hs)
    cuda_sync()
    t2 = time.perf_counter()
    sub.append(t1 - t0)
    tot.append(t2 - t0)
way = "core" if os.environ.get("PARTS_CORE") == "1" else "torch"
submitted, whole = statistics.median(sub), statistics.median(tot)
print(
    f"PARTS {way} submit {submitted * 1e3:.2f} ms, whole {whole * 1e3:.2f} ms "
    f"({submitted / 161 * 1e6:.1f} / {whole / 161 * 1e6:.1f} us per gradient)",
    flush=True,
)
hvd.shutdown()
