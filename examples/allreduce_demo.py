"""A short multi-rank demo: every collective once, printed by rank 0.

Run: mpiexec -n 4 python examples/allreduce_demo.py
"""

import numpy as np

import horovodlite as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()

gradient = np.full(1_000_003, float(rank), dtype=np.float32)
averaged = hvd.allreduce(gradient, name="gradient")  # Average by default
weights = hvd.broadcast(np.random.default_rng(rank).random(4), root_rank=0, name="weights")
gathered = hvd.allgather(np.full((rank + 1, 2), rank), name="uneven rows")
shard = hvd.reducescatter(np.ones((10, 3)), op=hvd.Sum, name="shard")
config = hvd.broadcast_object({"lr": 0.1 * size} if rank == 0 else None, root_rank=0)

if rank == 0:
    print(f"horovodlite {hvd.__version__} on {size} ranks")
    print(f"allreduce (Average) of ranks' values: {averaged[0]} (expected {(size - 1) / 2})")
    print(f"broadcast from rank 0: {np.round(weights, 3)}")
    print(f"allgather with uneven rows: shape {gathered.shape}, rows {gathered[:, 0].tolist()}")
    print(f"reducescatter of 10 rows: rank 0 holds {shard.shape[0]} rows of {shard[0, 0]}")
    print(f"broadcast_object: {config}")
