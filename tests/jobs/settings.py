"""Print the engine's settings as JSON, run a few async collectives, and exit."""

import json

import numpy as np

import horovodlite as hvd

hvd.init()
engine = hvd.state.current().engine
settings = {
    "cycle_time_ms": engine.cycle_time * 1000,
    "fusion_threshold": engine.fusion_threshold,
    "stall_check": engine.stall_check,
    "stall_shutdown": engine.stall_shutdown,
    "timeline": None if engine.timeline is None else engine.timeline.path,
}
handles = [hvd.allreduce_async(np.ones(4), name=f"t{i}") for i in range(3)]
for handle in handles:
    hvd.synchronize(handle)
print("SETTINGS " + json.dumps(settings), flush=True)
