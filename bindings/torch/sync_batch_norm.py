"""SyncBatchNorm: batch normalization with statistics over the whole global batch."""

import horovodlite as core
import torch
from horovodlite.process_sets import global_process_set
from torch.nn.modules.batchnorm import _BatchNorm

from .mpi_ops import allreduce

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training statistics are reduced over all ranks.

    The per-rank sums and sums of squares go through one differentiable all-reduce, so the
    backward pass reduces their gradients the same way.
    """

    def __init__(
        self,
        num_features,
        eps=1e-05,
        momentum=0.1,
        affine=True,
        track_running_stats=True,
        process_set=global_process_set,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2-D input (N, C, ...), got {input.dim()}-D")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or self.process_set.size() == 1:
            return super().forward(input)
        dims = [0] + list(range(2, input.dim()))
        # float64 statistics: the sum-of-squares form would lose digits in float32. The count
        # lies on the input's device: torch.cat takes no CPU tensor beside CUDA ones.
        count = torch.full((1,), input.numel() / input.shape[1], dtype=torch.float64,
                           device=input.device)  # fmt: skip
        x = input.to(torch.float64)
        stats = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        total = allreduce(stats, op=core.Sum, name=None, process_set=self.process_set)
        channels = input.shape[1]
        n = total[-1]
        mean = total[:channels] / n
        var = total[channels : 2 * channels] / n - mean * mean
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = self.momentum
                if momentum is None:
                    momentum = 1.0 / float(self.num_batches_tracked)
                unbiased = var * n / (n - 1) if n > 1 else var
                self.running_mean.mul_(1 - momentum).add_(momentum * mean.to(input.dtype))
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased.to(input.dtype))
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        out = out.to(input.dtype)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out
