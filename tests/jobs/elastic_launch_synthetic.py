"""The shape of Horovod's pytorch_synthetic_benchmark_elastic.py, written anew for horovodlite.

    elastic_synthetic.py [--batch-size B] [--num-iters N] [--num-batches-per-iter K]
                         [--kill-iter I]

A small convolutional model trains on one synthetic batch; each iteration times K batches and
commits. The learning rate follows the size through a reset callback, as in Horovod's script.
With --kill-iter, rank 1 SIGKILLs itself at that iteration on the first run.
"""

import argparse
import os
import signal
import timeit

import horovodlite.torch as hvd
import numpy as np
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--num-warmup-batches", type=int, default=1)
parser.add_argument("--num-batches-per-iter", type=int, default=2)
parser.add_argument("--num-iters", type=int, default=4)
parser.add_argument("--kill-iter", type=int, default=-1)
args = parser.parse_args()

hvd.init()
torch.manual_seed(1234)
restart = int(os.environ.get("HOROVODLITE_ELASTIC_RESTART", "0"))
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
    torch.nn.Flatten(), torch.nn.Linear(8 * 16, 10),
)  # fmt: skip
base_lr = 0.01
optimizer = torch.optim.SGD(model.parameters(), lr=base_lr * hvd.size())
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
data = torch.randn(args.batch_size, 3, 32, 32)
target = torch.randint(0, 10, (args.batch_size,))


def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


def benchmark_step(state) -> None:
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(data), target).backward()
    optimizer.step()
    state.batch += 1


@hvd.elastic.run
def run_benchmark(state) -> None:
    log(f"Running at size {hvd.size()} from iteration {state.iter}")
    timeit.timeit(lambda: benchmark_step(state), number=args.num_warmup_batches)
    while state.iter < args.num_iters:
        if restart == 0 and state.iter == args.kill_iter and hvd.rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        seconds = timeit.timeit(lambda: benchmark_step(state), number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{state.iter}: {img_sec:.1f} img/sec per CPU")
        state.img_secs.append(img_sec)
        state.iter += 1
        state.commit()
    mean, conf = np.mean(state.img_secs), 1.96 * np.std(state.img_secs)
    log(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")


def on_state_reset() -> None:
    # The size may have changed: scale the learning rate to it, as Horovod's script does.
    for group in optimizer.param_groups:
        group["lr"] = base_lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, img_secs=[], iter=0, batch=0)
state.register_reset_callbacks([on_state_reset])
run_benchmark(state)
