"""Print where each rank runs: the scheduler tests check the placement horovodlite-run chose."""

import horovodlite as hvd

hvd.init()
total = hvd.allreduce(__import__("numpy").ones(1), op=hvd.Sum)[0]
print(
    f"rank {hvd.rank()} of {hvd.size()}: local {hvd.local_rank()} of {hvd.local_size()}, "
    f"host {hvd.cross_rank()}, sum {total:g}",
    flush=True,
)
hvd.shutdown()
