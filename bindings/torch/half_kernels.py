"""torch's vectorized float16 and bfloat16 arithmetic, lent to the core for host arrays.

numpy adds, multiplies and scales half types one element at a time in software, 20x slower than
torch's vectorized kernels on this machine (horovodlite/ops.py). torch computes them in float32
and rounds once to the half type, as numpy does, so the results are bit for bit numpy's
(tests/test_transport.py tries them on every value); importing the binding lends them to the
core (ops.use_half_kernels), where they take the large host arrays of every path: the ring's
and the MPI library's reductions, and the scaling on the way in and out.
"""

import numpy as np

import torch
from horovodlite import ops

__all__ = ["TORCH_HALF_KERNELS"]


def _tensor(array) -> torch.Tensor:
    """Return a torch view of a contiguous, writeable host float16 or bfloat16 (ml_dtypes)
    array (ops.half_kernels_for hands over no other)."""
    if array.dtype == np.float16:
        return torch.from_numpy(array)
    return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)


class _TorchHalfKernels(ops.HalfKernels):
    def combine(self, acc, incoming, op) -> None:
        into = _tensor(acc)
        (torch.add if op is ops.Sum else torch.mul)(into, _tensor(incoming), out=into)

    def multiply(self, source, factor: float, out) -> None:
        torch.mul(_tensor(source), factor, out=_tensor(out))


TORCH_HALF_KERNELS = _TorchHalfKernels()
ops.use_half_kernels(TORCH_HALF_KERNELS)
