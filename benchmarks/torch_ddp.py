"""Training step time: horovodlite.torch.DistributedOptimizer against torch's DDP on Gloo.

`python benchmarks/torch_ddp.py --np 2,4` starts one MPI job per rank count (and one single
process), prints a table and writes benchmarks/results/torch_ddp.json. In each job every rank
trains the same two models (a small CNN and an MLP of 4096 x 4096 layers) with each contender,
the contenders taking turns in short blocks so that background load hits all alike:

    local         no communication: the compute part of a step at this rank count
    hvd           DistributedOptimizer, one all-reduce per gradient from its hook, fused
    hvd-nofusion  the same with the engine's fusion threshold at 0 (one collective per gradient)
    hvd-after     no hooks: after backward(), one grouped_allreduce_ of every gradient
    ddp           DistributedDataParallel on the gloo backend (TCP store on 127.0.0.1)

A step is zero_grad, forward, backward and optimizer step (SGD with momentum). Each step is
timed on every rank; the slowest rank's time counts, and the median over all blocks is kept.
"""

import json
import os
import time

from training_jobs import argument_parser, run_and_report, slowest_rank, summary

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CONTENDERS = ("local", "hvd", "hvd-nofusion", "hvd-after", "ddp")


def parse_args(argv=None):
    parser = argument_parser(__doc__, CONTENDERS, os.path.join(RESULTS, "torch_ddp.json"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank (0: auto)")
    return parser.parse_args(argv)


# -- the worker: one MPI job ------------------------------------------------------------------


def build_model(kind: str, width: int):
    from torch import nn

    if kind == "cnn":  # the network of PyTorch's MNIST example: 1.2 M parameters
        return nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10),
        )  # fmt: skip
    if kind == "mlp":  # 1024 -> width -> width -> width -> 10: 37.8 M parameters at 4096
        return nn.Sequential(
            nn.Linear(1024, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10),
        )  # fmt: skip
    raise ValueError(f"unknown model {kind!r}: use cnn or mlp")


def batch(kind: str, size: int, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    shape = (size, 1, 28, 28) if kind == "cnn" else (size, 1024)
    return torch.randn(shape, generator=generator), torch.randint(
        0, 10, (size,), generator=generator
    )


class Trainer:
    """One contender's model, optimizer and step."""

    def __init__(self, contender: str, kind: str, args, state: dict):
        import horovodlite.torch as hvd
        import torch

        self.contender, self.hvd = contender, hvd
        self.model = build_model(kind, args.mlp_width)
        self.model.load_state_dict(state)
        self.forward = self.model
        if contender == "ddp":
            self.forward = torch.nn.parallel.DistributedDataParallel(self.model)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        if contender.startswith("hvd") and contender != "hvd-after":
            optimizer = hvd.DistributedOptimizer(
                optimizer, named_parameters=self.model.named_parameters()
            )
        self.optimizer = optimizer

    def step(self, x, y) -> None:
        import torch.nn.functional as F

        self.optimizer.zero_grad()
        F.cross_entropy(self.forward(x), y).backward()
        if self.contender == "hvd-after":
            # zero_grad() sets gradients to None: backward() makes new tensors every step.
            grads = [p.grad for p in self.model.parameters()]
            self.hvd.grouped_allreduce_(grads, name="hvd-after.grads")
        self.optimizer.step()


def worker(args) -> None:
    import horovodlite.torch as hvd
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import horovodlite

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    threads = args.threads or max(1, (os.cpu_count() or 1) // size)
    torch.set_num_threads(threads)
    hvd.init()
    engine = horovodlite.state.current().engine
    default_threshold = engine.fusion_threshold
    contenders = args.contenders.split(",")
    if size == 1:
        contenders = ["local"]
    if "ddp" in contenders:
        # Rank 0 opens the store on a free port and tells the others through MPI.
        store = None
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
        port = comm.bcast(store.port if rank == 0 else None, root=0)
        if rank != 0:
            store = dist.TCPStore("127.0.0.1", port, size, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size)

    results, checks = [], {}
    for kind in args.models.split(","):
        torch.manual_seed(0)
        state = build_model(kind, args.mlp_width).state_dict()
        trainers = {c: Trainer(c, kind, args, state) for c in contenders if c != "hvd-nofusion"}
        if "hvd-nofusion" in contenders:
            trainers["hvd-nofusion"] = trainers.get("hvd") or Trainer("hvd", kind, args, state)
        x, y = batch(kind, args.batch_size, seed=rank)

        # Two steps of each from equal weights on equal data must give equal weights: the
        # contenders compute the same thing, so their times are comparable.
        for name in ("hvd", "hvd-after", "ddp"):
            for _ in range(2 if name in trainers else 0):
                trainers[name].step(x, y)
        reference = trainers.get("ddp") or trainers.get("hvd-after")
        for name in ("hvd", "hvd-after"):
            if name in trainers and reference is not None and trainers[name] is not reference:
                diff = max(
                    (a - b).abs().max().item()
                    for a, b in zip(trainers[name].model.parameters(), reference.model.parameters())
                )
                checks[f"{kind}:{name} vs {reference.contender}"] = slowest_rank(comm, [diff])[0]

        times = {c: [] for c in contenders}
        for round_ in range(args.rounds):
            shift = round_ % len(contenders)  # rotate the order so no contender is always first
            for contender in contenders[shift:] + contenders[:shift]:
                trainer = trainers[contender]
                engine.fusion_threshold = 0 if contender == "hvd-nofusion" else default_threshold
                for _ in range(args.warmup):
                    trainer.step(x, y)
                comm.Barrier()
                block = []
                for _ in range(args.steps):
                    start = time.perf_counter()
                    trainer.step(x, y)
                    block.append(time.perf_counter() - start)
                times[contender].extend(slowest_rank(comm, block))
        engine.fusion_threshold = default_threshold
        params = sum(p.numel() for p in trainers[contenders[0]].model.parameters())
        results += [summary(size, kind, params, c, values) for c, values in times.items()]
        del trainers
    if rank == 0:
        with open(args.worker, "w") as f:
            json.dump({"np": size, "threads": threads, "results": results, "checks": checks}, f)
    if dist.is_initialized():
        dist.destroy_process_group()


# -- the driver: one job per rank count, then the table --------------------------------------


def _versions() -> dict:
    import torch

    return {"torch": torch.__version__}


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(args)
        return
    run_and_report(__file__, args, CONTENDERS, ratio=("hvd", "ddp"), versions=_versions)


if __name__ == "__main__":
    main()
