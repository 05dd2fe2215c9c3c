"""At one rank: 161 ResNet-50-shaped torch tensors (or small ones), async fused vs one sync each, in turns."""
import os, sys, statistics, time
sys.path.insert(0, ".")
import torch
import horovodlite.torch as hvd
from engine_fusion import RESNET50_SHAPES
hvd.init()
torch.set_num_threads(1)
small = len(sys.argv) > 1 and sys.argv[1] == "small"
grads = [torch.randn((256,) if small else s) for s in RESNET50_SHAPES]
engine = hvd.state.current().engine if hasattr(hvd, "state") else None
import horovodlite
engine = horovodlite.state.current().engine
def fused():
    hs = [hvd.allreduce_async_(g, name=f"g{i}") for i, g in enumerate(grads)]
    for h in hs:
        hvd.synchronize(h)
def one():
    for i, g in enumerate(grads):
        hvd.allreduce_(g, name=f"g{i}")
res = {"fused": [], "one": []}; cyc = []
for f in (fused, one): f()
for _ in range(30):
    for name, f in (("fused", fused), ("one", one)):
        c0 = engine.cycles; t = time.perf_counter(); f(); res[name].append(time.perf_counter() - t)
        if name == "fused": cyc.append(engine.cycles - c0)
print({k: round(statistics.median(v) * 1e3, 3) for k, v in res.items()}, "cycles", statistics.median(cyc), os.environ.get("HOROVODLITE_TRANSPORT"))
hvd.shutdown()
