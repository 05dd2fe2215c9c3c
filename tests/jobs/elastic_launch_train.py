"""A deterministic elastic torch job for the launcher's tests: hvd.elastic.run, TorchState and
ElasticSampler.

    elastic_launch_train.py OUT [--kill-step S] [--kill-rank R] [--commit-every C] [--epochs E]
                            [--step-seconds T]

A linear model learns y = X w from 24 samples, batch 2 per rank, SGD with momentum through
DistributedOptimizer, committing every C steps and at each epoch's end. On the first run
(HOROVODLITE_ELASTIC_RESTART=0) rank R SIGKILLs itself before step S. Every rank appends one
JSON line per step to OUT/steps.jsonl ({restart, size, rank, epoch, step, indices}); rank 0
writes the final parameters (exact float reprs) to OUT/final.json.
"""

import argparse
import json
import os
import signal
import time

import horovodlite.torch as hvd
import torch

SAMPLES, FEATURES, BATCH = 24, 4, 2


class Indexed(torch.utils.data.Dataset):
    """Samples that also return their index, so the test can check coverage."""

    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(SAMPLES, FEATURES, generator=g, dtype=torch.float64)
        self.y = self.x @ torch.arange(1.0, FEATURES + 1, dtype=torch.float64)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill-step", type=int, default=0)
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--commit-every", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep in each step")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    restart = int(os.environ.get("HOROVODLITE_ELASTIC_RESTART", "0"))
    dataset = Indexed()
    model = torch.nn.Linear(FEATURES, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0,
                                   step=0)  # fmt: skip
    log = open(os.path.join(args.out, "steps.jsonl"), "a")

    @hvd.elastic.run
    def train(state):
        for epoch in range(state.epoch, args.epochs):
            state.epoch = epoch
            sampler.set_epoch(epoch)
            for batch_idx, (x, y, index) in enumerate(loader):
                step = state.step + 1
                if restart == 0 and step == args.kill_step and hvd.rank() == args.kill_rank:
                    time.sleep(0.5)  # the others wait in the step's all-reduce, and mark it
                    os.kill(os.getpid(), signal.SIGKILL)
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
                loss.backward()
                optimizer.step()
                time.sleep(args.step_seconds)  # time for the launcher to find new hosts
                sampler.record_batch(batch_idx, BATCH)
                state.step = step
                record = {"restart": restart, "size": hvd.size(), "rank": hvd.rank(),
                          "epoch": epoch, "step": step, "indices": index.tolist()}  # fmt: skip
                log.write(json.dumps(record) + "\n")
                log.flush()
                if step % args.commit_every == 0:
                    state.commit()
            state.commit()

    train(state)
    if hvd.rank() == 0:
        params = [repr(v) for p in model.parameters() for v in p.detach().flatten().tolist()]
        with open(os.path.join(args.out, "final.json"), "w") as f:
            json.dump({"params": params, "size": hvd.size(), "steps": state.step}, f)


if __name__ == "__main__":
    main()
