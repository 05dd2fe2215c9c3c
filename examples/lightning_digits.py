"""Train a small CNN on scikit-learn's digits with PyTorch Lightning and horovodlite.

Run: horovodlite-run -np 2 python examples/lightning_digits.py --checkpoint-dir /tmp/digits
 or: mpiexec -n 2 python examples/lightning_digits.py
With the default settings (8 epochs, 32 images per rank per step, lr 0.025 per rank) it reaches
a test accuracy of about 0.98 at 2 ranks. It exits non-zero below --target.
"""

import argparse
import os

import horovodlite.lightning  # noqa: F401  (registers Trainer(strategy="horovodlite"))
import horovodlite.torch as hvd
import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=8)
parser.add_argument("--max-steps", type=int, default=-1, help="stop training early (-1: no)")
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.025, help="per rank; scaled by the size")
parser.add_argument("--accumulate", type=int, default=1, help="batches per optimizer step")
parser.add_argument("--precision", default="32-true", help="e.g. bf16-mixed")
parser.add_argument("--checkpoint-dir", default=None, help="where rank 0 saves checkpoints")
parser.add_argument("--target", type=float, default=0.0, help="test accuracy to reach")
args = parser.parse_args()

# The same split on every rank; Lightning's DistributedSampler gives each rank its shard.
digits = load_digits()
images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)  # N x 1 x 8 x 8
labels = torch.tensor(digits.target, dtype=torch.int64)
order = torch.from_numpy(np.random.default_rng(0).permutation(len(labels)))
images, labels = images[order], labels[order]
# 396 test images: an equal share for 2, 3 or 4 ranks, so no rank scores a padded duplicate.
train = TensorDataset(images[:1400], labels[:1400])
test = TensorDataset(images[1400:1796], labels[1400:1796])


class Digits(pl.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        self.lr = lr
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True, sync_dist=True)  # averaged over the ranks
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        correct = (self(x).argmax(1) == y).sum().float()
        # Sums over batches and ranks: the accuracy of the whole test set.
        self.log("correct", correct, reduce_fx="sum", sync_dist=True)
        self.log("scored", float(len(y)), reduce_fx="sum", sync_dist=True)

    def configure_optimizers(self):
        # Scale the learning rate by the number of ranks: the global batch grows with it.
        return torch.optim.SGD(self.parameters(), lr=self.lr * self.trainer.world_size,
                               momentum=0.9)  # fmt: skip


torch.manual_seed(0)  # every rank starts from rank 0's weights anyway: the strategy broadcasts
model = Digits(args.lr)
callbacks = []
if args.checkpoint_dir:  # written by rank 0 only
    callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=args.checkpoint_dir, save_last=True))
trainer = pl.Trainer(
    strategy="horovodlite",
    accelerator="cpu",
    devices=1,  # per process: horovodlite-run or mpiexec starts the processes
    max_epochs=args.epochs,
    max_steps=args.max_steps,
    accumulate_grad_batches=args.accumulate,
    precision=args.precision,
    callbacks=callbacks,
    enable_checkpointing=bool(args.checkpoint_dir),
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
# The ranks share the host's cores (the Trainer has initialized horovodlite): give each its part.
torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
trainer.fit(model, DataLoader(train, batch_size=args.batch_size, shuffle=True))
train_loss = float(trainer.callback_metrics["train_loss_epoch"])
[result] = trainer.test(model, DataLoader(test, batch_size=args.batch_size), verbose=False)
accuracy = result["correct"] / result["scored"]
if trainer.is_global_zero:
    print(f"last epoch's train loss {train_loss:.4f}")
    print(f"test accuracy {accuracy:.4f} on {trainer.world_size} ranks")
if accuracy < args.target:
    raise SystemExit(f"test accuracy {accuracy:.4f} is below the target {args.target}")
