"""Train an MLP on scikit-learn's digits with parameter servers (hvd.ps), asynchronously.

    mpiexec -n 4 python examples/pytorch_ps_digits.py                 # 1 server, 3 workers
    mpiexec -n 4 python examples/pytorch_ps_digits.py --servers 2 --staleness 2

The last `--servers` ranks hold the parameters and run the optimizer; the other ranks train on
their own samples, each at its own pace (`--staleness`: none = fully asynchronous, s = at most s
steps ahead of the slowest worker, 0 = synchronous). Worker 0 prints the test accuracy of the
final parameters (about 0.9 with the defaults) and the servers' report.
"""

import argparse
import functools

import horovodlite.torch as hvd
import torch
from sklearn.datasets import load_digits

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--servers", type=int, default=1)
parser.add_argument("--staleness", default="none", help="'none' or an int")
parser.add_argument("--steps", type=int, default=300, help="steps per worker")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.3)
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)  # every rank starts from the same parameters (hvd.ps checks it)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
staleness = None if args.staleness == "none" else int(args.staleness)
job = hvd.ps.start(model, functools.partial(torch.optim.SGD, lr=args.lr),
                   servers=args.servers, staleness=staleness)  # fmt: skip

if job.is_server:
    job.serve()
else:
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
    generator = torch.Generator().manual_seed(hvd.rank())  # each worker its own samples
    for _ in range(args.steps):
        rows = torch.randint(0, len(x_train), (args.batch_size,), generator=generator)
        # The forward waits for the current parameters; push() sends the gradients.
        torch.nn.functional.cross_entropy(model(x_train[rows]), y_train[rows]).backward()
        job.push()
    report = job.finish()  # the final parameters are now in `model`
    if hvd.rank() == 0:
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        print(f"test accuracy {accuracy:.3f} on {hvd.size()} ranks")
        print(
            f"servers: {report['pushes']} pushes, {report['pushes_per_s']:.0f} pushes/s, "
            f"staleness mean {report['staleness_mean']:.2f}, max {report['staleness_max']}"
        )
