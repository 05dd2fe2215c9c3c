"""Count how often each of 30 samples is trained on, with TorchState and ElasticSampler.

argv: epochs, then the commit after which every rank does one more batch and dies (-1: never).
Batches of 2 per rank, a commit after each. The model's one parameter holds the counts, summed
over the ranks; rank 0 prints them at the end.
"""

import os
import sys

import horovodlite.torch as hvd
import torch

epochs, die_after = int(sys.argv[1]), int(sys.argv[2])
hvd.init()
counts = torch.nn.Module()
counts.seen = torch.nn.Parameter(torch.zeros(30), requires_grad=False)
sampler = hvd.elastic.ElasticSampler(range(30), shuffle=True, seed=1)
state = hvd.elastic.TorchState(model=counts, sampler=sampler, epoch=0)
state.register_reset_callbacks(
    [lambda: print(f"rank {hvd.rank()} reset at size {hvd.size()} epoch {state.epoch}", flush=True)]
)


def train_batch(batch):
    mine = torch.zeros(30)
    mine[sampler.get_indices(batch, 2)] += 1
    with torch.no_grad():
        counts.seen += hvd.allreduce(mine, op=hvd.Sum, name="counts")


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, epochs):  # noqa: B020 (Horovod's idiom)
        sampler.set_epoch(state.epoch)
        for batch in range(-(-len(sampler) // 2)):
            train_batch(batch)
            sampler.record_batch(batch, 2)
            state.commit()
            if state.commit_number == die_after:
                train_batch(batch + 1)  # work after the last commit, lost with the ranks
                os._exit(3)


train(state)
if hvd.rank() == 0:
    print("seen", [int(c) for c in counts.seen.tolist()], "commit", state.commit_number, flush=True)
