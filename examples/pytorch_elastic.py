"""Elastic training of a small CNN on scikit-learn's digits: survives lost workers, grows.

Run (3 workers, at least 2, a commit every 10 steps; the discovery script prints the hosts):
    horovodlite-run -np 3 --min-np 2 --max-np 3 --host-discovery-script ./discover.sh \\
        python examples/pytorch_elastic.py --fail-at-step 25
With --fail-at-step, rank 1 kills itself (SIGKILL) at that step on the first run: the launcher
restarts the job and it resumes from its last commit. The ElasticSampler gives every training
image once per epoch whatever the size; the learning rate follows the size through a reset
callback. Rank 0 prints the test accuracy at the end: 0.977 with the defaults in a run that
lost a worker (3 -> 2 ranks), 0.992 after 20 epochs in the run shown in docs/elastic.md.
"""

import argparse
import os
import signal

import horovodlite.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.025, help="per rank; scaled by the size")
parser.add_argument("--commit-every", type=int, default=10, help="steps between commits")
parser.add_argument("--fail-at-step", type=int, default=0, help="rank 1 dies there (first run)")
args = parser.parse_args()

hvd.init()
torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
restart = int(os.environ.get("HOROVODLITE_ELASTIC_RESTART", "0"))

digits = load_digits()
images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
labels = torch.tensor(digits.target, dtype=torch.int64)
order = torch.from_numpy(np.random.default_rng(0).permutation(len(labels)))
images, labels = images[order], labels[order]
train = torch.utils.data.TensorDataset(images[:1400], labels[:1400])
test_x, test_y = images[1400:], labels[1400:]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(train, shuffle=True, seed=0)
loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, sampler=sampler)


def scale_lr() -> None:
    """After a restart the size may differ: keep the learning rate per rank."""
    for group in optimizer.param_groups:
        group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, step=0)
state.register_reset_callbacks([scale_lr])


@hvd.elastic.run
def training(state):
    if hvd.rank() == 0:
        print(f"run {restart}: {hvd.size()} ranks from epoch {state.epoch}, step {state.step}",
              flush=True)  # fmt: skip
    for epoch in range(state.epoch, args.epochs):
        state.epoch = epoch
        sampler.set_epoch(epoch)
        for batch, (x, y) in enumerate(loader):
            state.step += 1
            if restart == 0 and state.step == args.fail_at_step and hvd.rank() == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            sampler.record_batch(batch, args.batch_size)
            if state.step % args.commit_every == 0:
                state.commit()
        state.epoch = epoch + 1  # a restart from this commit begins the next epoch
        state.commit()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1} done at step {state.step}", flush=True)


training(state)
model.eval()
with torch.no_grad():
    shard_x, shard_y = test_x[hvd.rank() :: hvd.size()], test_y[hvd.rank() :: hvd.size()]
    correct = (model(shard_x).argmax(1) == shard_y).float().sum().item()
counts = hvd.allreduce(torch.tensor([correct, float(len(shard_y))]), op=hvd.Sum, name="test")
if hvd.rank() == 0:
    print(f"test accuracy {(counts[0] / counts[1]).item():.4f} on {hvd.size()} ranks")
