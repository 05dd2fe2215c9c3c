"""Adasum with PyTorch: what the op does to two gradients, then training with it.

Part 1 all-reduces orthogonal and parallel vectors with op=Adasum: orthogonal ones add up,
parallel ones are averaged. Part 2 trains a small regression model with
DistributedOptimizer(op=hvd.Adasum) and Adam: each rank steps on its own batch, and the ranks'
updates are combined with Adasum. The learning rate is the single-process one: Adasum needs no
scaling by the number of ranks (docs/adasum.md). The number of ranks must be a power of two.

Run: mpiexec -n 2 python examples/pytorch_adasum.py   (a few seconds)
"""

import argparse

import horovodlite.torch as hvd
import torch


def show_the_op() -> None:
    n, r = hvd.size(), hvd.rank()
    orthogonal = torch.zeros(n)
    orthogonal[r] = 1.0  # rank r's vector points along axis r
    parallel = torch.full((3,), float(r + 1))  # same direction, different lengths
    added = hvd.allreduce(orthogonal, op=hvd.Adasum, name="orthogonal")
    averaged = hvd.allreduce(parallel, op=hvd.Adasum, name="parallel")
    if r == 0:
        print(f"Adasum of orthogonal unit vectors: {added.tolist()} (their sum)")
        print(f"Adasum of parallel vectors 1..{n}: {averaged.tolist()} (their average)")


def train(steps: int, lr: float) -> float:
    torch.manual_seed(0)  # the same model and the same target function on every rank
    teacher = torch.nn.Linear(16, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=lr),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(1000 + hvd.rank())  # each rank its own data
    for _ in range(steps):
        x = torch.randn(32, 16, generator=generator)
        with torch.no_grad():
            y = teacher(x)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()  # local Adam step, then the ranks' updates combined with Adasum
    # The parameters are the same on every rank: evaluate once, on fresh data.
    x = torch.randn(512, 16, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), teacher(x)).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    hvd.init()
    show_the_op()
    loss = train(args.steps, args.lr)
    if hvd.rank() == 0:
        print(f"test loss {loss:.4f} after {args.steps} steps on {hvd.size()} ranks")


if __name__ == "__main__":
    main()
