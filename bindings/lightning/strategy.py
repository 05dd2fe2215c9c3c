"""HorovodLiteStrategy: Lightning's data-parallel training on horovodlite's DistributedOptimizer."""

import socket
from typing import Any, Optional

import horovodlite.torch as hvd
import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.optimizer import _optimizers_to_device
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from pytorch_lightning.strategies.parallel import ParallelStrategy
from pytorch_lightning.trainer.states import TrainerFn
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from horovodlite.config import Settings

from .environment import HorovodLiteEnvironment

__all__ = ["HorovodLiteStrategy"]

# Lightning names reductions as strings or torch.distributed.ReduceOp members.
_OPS = {
    "mean": hvd.Average, "avg": hvd.Average, "average": hvd.Average, "sum": hvd.Sum,
    "max": hvd.Max, "min": hvd.Min, "product": hvd.Product, "prod": hvd.Product,
}  # fmt: skip


def _reduce_op(reduce_op) -> Any:
    name = reduce_op if isinstance(reduce_op, str) else getattr(reduce_op, "name", None)
    op = _OPS.get(str(name).lower()) if name is not None else None
    if op is None:
        raise ValueError(
            f"reduce_op {reduce_op!r} is not supported: use 'mean', 'sum', 'max', 'min' or "
            f"'product' (or the torch.distributed.ReduceOp of the same name)"
        )
    return op


def _gpu_index(local_rank: int, local_size: int, device_count: int, transport: str) -> int:
    """Return the GPU of the rank with `local_rank` among the `local_size` ranks of its host.

    One GPU per rank, as Lightning's DDP: local rank r takes GPU r. With more ranks than GPUs
    they share them (GPU r % device_count) only where GPU data moves over MPI (`transport` is
    "mpi"): NCCL, which the automatic transport prefers, refuses two ranks on one GPU.

    Raises:
        ValueError: torch sees no GPU, or fewer GPUs than ranks and a transport other than MPI.
    """
    if device_count < 1:
        raise ValueError(
            "accelerator='gpu' but torch sees no GPU (torch.cuda.device_count() is 0): run on a "
            "machine with GPUs and a CUDA build of torch, or use accelerator='cpu'"
        )
    if local_size <= device_count:
        return local_rank
    if transport == "mpi":
        return local_rank % device_count
    raise ValueError(
        f"accelerator='gpu' with {local_size} ranks on host {socket.gethostname()!r} but "
        f"{device_count} GPU{'s' if device_count > 1 else ''} (torch.cuda.device_count()): start "
        f"at most {device_count} rank{'s' if device_count > 1 else ''} per host, one per GPU "
        f"(mpiexec -n, horovodlite-run -np), or set HOROVODLITE_TRANSPORT=mpi to let ranks share "
        f"the GPUs (their data then moves over MPI, through host memory unless the MPI is "
        f"CUDA-aware; NCCL refuses two ranks on one GPU)"
    )


def _process_set(group) -> Any:
    if group is None:
        return hvd.global_process_set
    if isinstance(group, hvd.ProcessSet):
        return group
    raise TypeError(
        f"group must be None or a horovodlite ProcessSet (hvd.add_process_set), got "
        f"{type(group).__name__}"
    )


class HorovodLiteStrategy(ParallelStrategy):
    """Data-parallel training, one process per device, started by mpiexec or horovodlite-run.

    Rank 0's model (and optimizer state) is broadcast at setup; each optimizer is wrapped in
    `horovodlite.torch.DistributedOptimizer`, whose hooks all-reduce (average) every gradient
    while backward still runs, fused by the engine. With `accumulate_grad_batches=k` the
    gradients are all-reduced once per k batches (`backward_passes_per_step=k`). The learning
    rate is not scaled: the run equals one process training on the batches of all ranks.

    Args:
        compression: `hvd.Compression.none`, `.fp16` or `.bf16` for the gradients on the wire.
        gradient_predivide_factor: divide gradients by this before the sum, the rest after.
        num_groups, groups: all-reduce gradients in groups, as DistributedOptimizer.
        sparse_as_dense: all-reduce sparse gradients as dense tensors.
    """

    strategy_name = "horovodlite"

    def __init__(
        self,
        accelerator: Optional["pl.accelerators.Accelerator"] = None,
        parallel_devices: Optional[list] = None,
        checkpoint_io=None,
        precision_plugin=None,
        compression=hvd.Compression.none,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups=None,
        sparse_as_dense: bool = False,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=HorovodLiteEnvironment(),
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
        )
        self._optimizer_options = dict(
            compression=compression,
            gradient_predivide_factor=gradient_predivide_factor,
            num_groups=num_groups,
            groups=groups,
            sparse_as_dense=sparse_as_dense,
        )
        # Every rank trains: the cluster environment's ranks are the global ones.
        self._process_set = hvd.global_process_set
        self._gpu = None  # this rank's GPU index, chosen at the first question

    @property
    def is_distributed(self) -> bool:
        # Lightning reads this from custom strategies to add DistributedSamplers and to reduce
        # self.log(..., sync_dist=True).
        return True

    @property
    def root_device(self) -> torch.device:
        devices = self.parallel_devices or [torch.device("cpu")]
        if devices[0].type != "cuda":
            return devices[0]
        if self._gpu is None:  # asked for every batch: decide once
            self._gpu = _gpu_index(
                self.local_rank,
                hvd.local_size(),
                torch.cuda.device_count(),
                Settings.from_environment().transport,
            )
        return torch.device("cuda", self._gpu)

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self._process_set.size(), "rank": self._process_set.rank()}

    def model_to_device(self) -> None:
        self.model.to(self.root_device)

    def set_world_ranks(self) -> None:
        """Initialize horovodlite and tell Lightning's rank_zero_only which rank this is."""
        rank_zero_only.rank = utils_rank_zero_only.rank = self.global_rank

    def setup(self, trainer: "pl.Trainer") -> None:
        self.accelerator.setup(trainer)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        # Every stage starts from rank 0's weights (and buffers), as one process would.
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self.optimizers = [
                self._distributed(optimizer, trainer.accumulate_grad_batches)
                for optimizer in self.optimizers
            ]
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)
            for optimizer in self.optimizers:
                hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def _distributed(self, optimizer, passes: int):
        named = [(name, p) for name, p in self.model.named_parameters()]
        mine = {p for group in optimizer.param_groups for p in group["params"]}
        return hvd.DistributedOptimizer(
            optimizer,
            named_parameters=[(name, p) for name, p in named if p in mine],
            backward_passes_per_step=passes,
            **self._optimizer_options,
        )

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # GradientAccumulationScheduler changes accumulate_grad_batches at an epoch's start,
        # after the last batch of the previous epoch stepped: no gradient is half-counted.
        passes = self.lightning_module.trainer.accumulate_grad_batches
        for optimizer in self.optimizers:
            if optimizer.backward_passes_per_step != passes:
                optimizer.set_backward_passes_per_step(passes)
        super().on_train_batch_start(batch, batch_idx)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        """Run the closure, wait for the averaged gradients, then clip (if asked) and step."""
        if not hasattr(optimizer, "skip_synchronize"):  # not one this strategy wrapped
            return super().optimizer_step(optimizer, closure, model, **kwargs)

        def closure_then_synchronize():
            # Lightning clips gradients and calls on_before_optimizer_step right after the
            # closure: they must see the averaged gradients, as with DDP.
            result = closure()
            optimizer.synchronize()
            return result

        with optimizer.skip_synchronize():
            return super().optimizer_step(optimizer, closure_then_synchronize, model, **kwargs)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        """Return `tensor` reduced over the ranks (mean by default); other values unchanged."""
        if not isinstance(tensor, torch.Tensor):
            return tensor
        op, process_set = _reduce_op(reduce_op), _process_set(group)
        if op is hvd.Average and not tensor.is_floating_point():
            # As Lightning's DDP: the mean of integers is a float.
            total = hvd.allreduce(tensor, op=hvd.Sum, process_set=process_set)
            return total / process_set.size()
        return hvd.allreduce(tensor, op=op, process_set=process_set)

    def all_gather(self, tensor, group=None, sync_grads: bool = False):
        """Return every rank's `tensor` stacked along a new first dimension, in rank order.

        With `sync_grads` the gather is differentiable, as Lightning's own: each rank's tensor
        gets the gradient of the sum of the ranks' losses (horovodlite.torch.allgather's).
        """
        process_set = _process_set(group)
        with torch.set_grad_enabled(sync_grads and torch.is_grad_enabled()):
            return hvd.allgather(tensor.unsqueeze(0), process_set=process_set)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        votes = torch.tensor(int(decision))
        total = int(hvd.allreduce(votes, op=hvd.Sum, process_set=self._process_set))
        return total == self._process_set.size() if all else total > 0

    def barrier(self, name: Optional[str] = None) -> None:
        hvd.barrier(process_set=self._process_set)

    def broadcast(self, obj, src: int = 0):
        return hvd.broadcast_object(obj, root_rank=src, process_set=self._process_set)

    def teardown(self) -> None:
        # The gradient hooks would otherwise outlive this fit: a later fit of the same model
        # would all-reduce every gradient twice.
        for optimizer in self.optimizers:
            for hook in getattr(optimizer, "_hvd_hooks", ()):
                hook.remove()
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="data-parallel training on horovodlite (MPI), started by "
            "horovodlite-run or mpiexec",
        )
