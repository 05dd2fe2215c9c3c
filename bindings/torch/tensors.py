"""Torch tensors as core arrays and back: zero-copy numpy views on the CPU, CuPy on the GPU.

The core works on numpy and CuPy arrays. A CPU tensor is viewed as numpy without copying
(bfloat16 through ml_dtypes); a CUDA tensor is viewed as CuPy through DLPack, which orders
CuPy's current stream after torch's with an event instead of waiting on the host (the CUDA array
interface makes CuPy synchronize torch's stream from the host, stalling the backward pass that
submits the gradient). Where CuPy is missing, or cannot hold the dtype (bfloat16), CUDA tensors
are staged through host memory.
"""

import importlib.util

import ml_dtypes
import numpy as np

import torch

from . import transport  # noqa: F401  (registers the gloo and nccl transports)

__all__ = ["TensorView"]

_CUPY = importlib.util.find_spec("cupy") is not None


class TensorView:
    """A tensor seen as a core array, and the way back to a tensor like it."""

    def __init__(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        self.tensor = tensor
        # (detach() only where autograd records: a call through torch's dispatcher, one of the
        # larger parts of a small collective's cost)
        detached = tensor.detach() if tensor.requires_grad else tensor
        self.staged = detached.is_cuda and (not _CUPY or detached.dtype == torch.bfloat16)
        if detached.is_cuda and not self.staged:
            import cupy  # optional: only CUDA tensors need it, and _CUPY says it is there

            self.array = cupy.from_dlpack(detached)
        else:
            self.array = _numpy_view(detached.cpu() if self.staged else detached)

    def to_tensor(self, array) -> torch.Tensor:
        """Return `array` (a result of the core) as a tensor on this tensor's device."""
        if isinstance(array, np.ndarray):
            out = _from_numpy(array)
            return out if self.tensor.is_cpu else out.to(self.tensor.device)
        return torch.from_dlpack(array)

    def write_back(self, array) -> torch.Tensor:
        """Finish an in-place collective: make the tensor hold `array`; return the tensor.

        The tensor's version counter moves on, as with torch's own in-place ops, so autograd
        refuses a backward pass that saved the old values.
        """
        if self.staged or not _shares(self.array, array):
            with torch.no_grad():
                self.tensor.copy_(self.to_tensor(array).reshape(self.tensor.shape))
        else:
            if self.tensor.is_cuda:
                # NCCL's result is ordered on CuPy's null stream (transport._run); a caller on a
                # side stream of its own would not wait for it without this.
                device = self.tensor.device
                torch.cuda.current_stream(device).wait_stream(torch.cuda.default_stream(device))
            torch.autograd.graph.increment_version(self.tensor)
        return self.tensor


def _shares(a, b) -> bool:
    if a is b:  # an in-place result is the array itself: no memory-overlap test needed
        return True
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.shares_memory(a, b)
    return a is b


def _numpy_view(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    if array.dtype == ml_dtypes.bfloat16:
        # (ascontiguousarray makes a 0-d array 1-d: the shape is put back)
        bits = np.ascontiguousarray(array).view(np.int16).reshape(array.shape)
        return torch.from_numpy(bits).view(torch.bfloat16)
    return torch.from_numpy(array)
