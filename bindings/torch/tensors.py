"""Torch tensors as core arrays and back: zero-copy numpy views on the CPU, CuPy on the GPU.

The core works on numpy and CuPy arrays. A CPU tensor is viewed as numpy without copying
(bfloat16 through ml_dtypes); a CUDA tensor as CuPy: by its address where torch and CuPy both
run on the default stream, which then orders everything, else through DLPack, which orders
CuPy's current stream after torch's with an event instead of waiting on the host (the CUDA array
interface makes CuPy synchronize torch's stream from the host, stalling the backward pass that
submits the gradient). Where CuPy is missing, or cannot hold the dtype (bfloat16), a CUDA
tensor's view is staged through host memory.

Where torch's own gloo or NCCL groups move a tensor, the short all-reduce and the engine take it
without any view (`TORCH_TENSORS`, small_allreduce.tensor_allreduce, fusion.TensorEntry): the
engine joins a batch into one torch buffer and splits it back. So the all-reduces of CUDA
tensors that no CuPy array holds stay on the GPU too, on torch's NCCL: those that go as they are
(contiguous or channels_last, on any stream; tensor_plans.py says which).
"""

import threading

import ml_dtypes
import numpy as np

import torch
from horovodlite.buffers import cupy_holds
from horovodlite.tensor_kind import TensorKind, use_device_tensors

from .transport import TorchTransport  # (importing it registers the gloo and nccl transports)

__all__ = ["TORCH_TENSORS", "TensorView", "on_default_stream", "ordered_for_caller"]


class TensorView:
    """A tensor seen as a core array, and the way back to a tensor like it."""

    def __init__(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        self.tensor = tensor
        # (detach() only where autograd records: a call through torch's dispatcher, one of the
        # larger parts of a small collective's cost)
        detached = tensor.detach() if tensor.requires_grad else tensor
        self.staged = detached.is_cuda and not cupy_holds(_NUMPY_DTYPES.get(detached.dtype))
        if detached.is_cuda and not self.staged:
            self.array = _cupy_view(detached)
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
            # (NCCL's result is ordered on CuPy's null stream, transport._run: the default one)
            ordered_for_caller(self.tensor)
            torch.autograd.graph.increment_version(self.tensor)
        return self.tensor


# torch's dtypes as the core names them (numpy's, and ml_dtypes' bfloat16).
_NUMPY_DTYPES = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}
_TORCH_DTYPES = {dtype: torch_dtype for torch_dtype, dtype in _NUMPY_DTYPES.items()}


class _TorchTensors(TensorKind):
    """Torch tensors as torch's gloo and NCCL groups move them: as they are (no view)."""

    def describe(self, tensor):
        dtype = _NUMPY_DTYPES.get(tensor.dtype)
        return None if dtype is None else (dtype, tuple(tensor.shape), not tensor.is_cuda)

    def contiguous(self, tensor) -> bool:
        return tensor.is_contiguous()

    def joinable(self, tensor) -> bool:
        # (channels_last: the gradients of a model's convolutions, where the model is)
        if tensor.is_contiguous():
            return True
        layout = _DENSE_LAYOUTS.get(tensor.dim())
        return layout is not None and tensor.is_contiguous(memory_format=layout)

    def carried_by(self, transport) -> bool:
        return isinstance(transport, TorchTransport)

    def empty_like(self, tensor):
        return torch.empty_like(tensor)

    def new(self, like, count: int):
        return torch.empty(count, dtype=like.dtype, device=like.device)

    def flat(self, tensor):
        return tensor.view(-1)

    def scale(self, tensor, factor: float) -> None:
        tensor.mul_(_as_the_core_scales(tensor, factor))

    def scales_alike(self, dtype) -> bool:
        return dtype in _SCALED_ALIKE

    def allreduce(self, transport, comm, out, source, op) -> None:
        transport.allreduce_tensor(comm, out, source, op)

    def join(self, tensors: list, prescale: float, reused: bool) -> tuple:
        # A 1-D tensor is its own flat view (a view costs 0.8 µs, and two thirds of a model's
        # gradients, its biases and norms' weights, are 1-D). One laid out in another order
        # (channels_last) is copied flat in its logical order, and split() copies it back.
        apart = [i for i, tensor in enumerate(tensors) if tensor.dim() != 1
                 and not tensor.is_contiguous()]  # fmt: skip
        flatten = torch.Tensor.reshape if apart else torch.Tensor.view  # (reshape: view or copy)
        flat = [tensor if tensor.dim() == 1 else flatten(tensor, -1) for tensor in tensors]
        sizes = [part.shape[0] for part in flat]
        if reused:  # (fresh host memory costs a page fault per 4 KiB: 7x the copy for ResNet-50)
            buffer = torch.cat(flat, out=_kept_buffer(tensors[0], sum(sizes)))
        else:
            buffer = torch.cat(flat)
        if prescale != 1.0:
            buffer.mul_(_as_the_core_scales(buffer, prescale))
        return buffer, (flat, sizes, apart)

    def split(self, buffer, parts: tuple, tensors: list, inplace: list, factor: float) -> list:
        # A few calls for the whole batch (on a GPU a launch per tensor costs more than a pass
        # over its memory): the factor on the buffer, then one copy into the in-place tensors'
        # flat views (join's); a view of a result only where it is handed out.
        flat, sizes, apart = parts
        pieces = buffer.split_with_sizes(sizes)
        every = not apart and all(inplace)  # (a gradient batch: every result is copied back)
        if every:
            back = range(len(tensors))
        else:  # (the in-place tensors that join() copied go back shaped as they are, below)
            back = [i for i, flag in enumerate(inplace) if flag and i not in apart]
        alone = ()
        if factor != 1.0 and not buffer.is_cuda and buffer.dtype in _FOREACH_SCALES_ALIKE:
            # On the host a pass over memory costs more than a call: a large in-place result
            # takes the factor on its way out, one pass where scaling first makes two.
            least = _SCALED_ON_THE_WAY_BYTES // buffer.element_size()
            alone = {i for i in back if sizes[i] >= least}
        if alone:
            for i in alone:
                torch.mul(pieces[i], factor, out=flat[i])
            back = [i for i in back if i not in alone]
            rest = [piece for i, piece in enumerate(pieces) if i not in alone]
            if rest:  # (torch refuses an empty list)
                torch._foreach_mul_(rest, factor)
        elif factor != 1.0:
            buffer.mul_(_as_the_core_scales(buffer, factor))
        if every and not alone:
            _copy_each(flat, pieces)
            return list(tensors)
        if back:
            _copy_each([flat[i] for i in back], [pieces[i] for i in back])
        for i in apart:
            if inplace[i]:
                tensors[i].copy_(pieces[i].view(tensors[i].shape))
        return [
            tensor if flag else piece if tensor.dim() == 1 else piece.view(tensor.shape)
            for tensor, piece, flag in zip(tensors, pieces, inplace)
        ]  # (a view costs 1.8 µs on the host: a flat result is its piece)

    def zeros(self, dtype, shape: tuple):
        device = torch.device("cuda", torch.cuda.current_device())
        return torch.zeros(shape, dtype=_TORCH_DTYPES[dtype], device=device)

    def to_core(self, tensor):
        return TensorView(tensor).array

    def from_core(self, array, tensor, inplace: bool):
        view = TensorView(tensor)
        return view.write_back(array) if inplace else view.to_tensor(array)


TORCH_TENSORS = _TorchTensors()
# A joined rank's zeros for GPU data that no CuPy array holds are torch's: the others' tensors
# travel as they are on NCCL (horovodlite/tensor_plans.py).
use_device_tensors(TORCH_TENSORS)

# The dtypes whose multiply by a factor torch rounds as staging.scale rounds the general way's
# view, bit for bit (tests/test_transport.py tries every half-type value on the host):
# float32 and float64 in their own precision; float16 and bfloat16 on the host in float32 math
# with a float32 factor, as numpy's; float16 on a GPU in float32 math with the factor rounded to
# float16 (_as_the_core_scales), which is CuPy's float16 multiply: from the exact product of two
# float16 values, one rounding either way; bfloat16 on a GPU in float32 math, as its view (no
# CuPy array holds bfloat16) scales on the host. Integers stay on the general way (it truncates
# through float64).
_SCALED_ALIKE = frozenset(
    np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)
)


# The dense layouts other than the contiguous one that join() copies in and split() back, by
# dimension: a channels_last model's convolutions have their gradients laid out so.
_DENSE_LAYOUTS = {4: torch.channels_last, 5: torch.channels_last_3d}


# torch's `_foreach_mul_` multiplies a half type on the host in its own precision (the factor
# rounded to it), unlike `mul_` and numpy: only these dtypes take it.
_FOREACH_SCALES_ALIKE = frozenset({torch.float32, torch.float64})


def _as_the_core_scales(like: torch.Tensor, factor: float) -> float:
    """Return `factor` as torch must multiply `like` by it to round as staging.scale does."""
    if like.dtype is torch.float16 and like.is_cuda:
        return float(np.float16(factor))
    return factor


def _copy_loop(targets: list, sources: list) -> None:
    for target, source in zip(targets, sources):
        target.copy_(source)


# One call copies a batch: torch's private `_foreach_copy_` (its optimizers use it), where this
# torch has it (since about 2.1), else one copy each.
_copy_each = getattr(torch, "_foreach_copy_", None) or _copy_loop

# On the host, in-place results of at least this size take the factor on their way out of the
# fused buffer (one pass over them, where scaling the buffer first makes two): ResNet-50's
# batch split and scaled in 10.8-12.0 ms so against 14.4 (the copies alone, one thread).
_SCALED_ON_THE_WAY_BYTES = 64 << 10

# per thread, {(device, dtype, CUDA stream): a flat buffer kept for the next batch}
_kept = threading.local()


def _kept_buffer(like: torch.Tensor, count: int) -> torch.Tensor:
    """Return a flat tensor of `count` elements of `like`'s dtype and device, kept by this
    thread for its next batch (grown to the largest so far), as the core's fusion buffer.

    On a GPU, one per stream: the work on a buffer is ordered only within its stream, so a batch
    on another stream must not write into one the last batch may still be reading."""
    buffers = getattr(_kept, "buffers", None)
    if buffers is None:
        buffers = _kept.buffers = {}
    key = (like.device, like.dtype, _stream_id(like.get_device()) if like.is_cuda else None)
    held = buffers.get(key)
    if held is None or held.shape[0] < count:
        held = buffers[key] = torch.empty(count, dtype=like.dtype, device=like.device)
    return held[:count]


def _cupy_view(tensor: torch.Tensor):
    """Return a CuPy array over a CUDA tensor's memory, ordered after the work queued on it.

    Where torch and CuPy both use the default stream (the common case, and the engine's), the
    array is made from the tensor's address: the stream orders everything, and that costs a few
    microseconds where DLPack's exchange costs tens (torch's Python side looks the streams up
    and compares them). Otherwise DLPack orders CuPy's stream after torch's with an event.
    """
    cupy = _cupy_module or _load_cupy()
    dtype = _NUMPY_DTYPES.get(tensor.dtype)
    count = tensor.numel()
    index = tensor.get_device()
    if not (
        dtype is not None
        and count
        and tensor.is_contiguous()
        and _default_is_current(index)
        and _cupy_stream().ptr == 0
    ):
        return cupy.from_dlpack(tensor)
    memory = _UnownedMemory(tensor.data_ptr(), count * dtype.itemsize, tensor, index)
    return cupy.ndarray(tuple(tensor.shape), dtype, _MemoryPointer(memory, 0))


# CuPy once imported, and what _cupy_view takes from it on every call (_load_cupy binds them).
_cupy_module = _cupy_stream = _UnownedMemory = _MemoryPointer = None


def _load_cupy():
    """Import CuPy (optional: only CUDA tensors need it, and cupy_holds says it is there) and bind
    the names _cupy_view takes from it on every call, once."""
    global _cupy_module, _cupy_stream, _UnownedMemory, _MemoryPointer
    import cupy

    _cupy_stream = cupy.cuda.get_current_stream
    _UnownedMemory, _MemoryPointer = cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer
    _cupy_module = cupy
    return cupy


# (device index) -> (stream id, device index, device type), what torch.cuda's current_stream()
# and default_stream() wrap in Python that costs several microseconds a call.
_current_stream = getattr(torch._C, "_cuda_getCurrentStream", None)
_default_stream = getattr(torch._C, "_cuda_getDefaultStream", None)


def ordered_for_caller(tensor: torch.Tensor) -> torch.Tensor:
    """Return `tensor`, a result queued on its GPU's default stream (the engine's work, NCCL's
    on CuPy's null stream), after making the caller's current stream wait for that stream: a
    caller on a side stream of its own would not wait for it otherwise; and the tensor's memory
    is kept from reuse until that stream is done with it (torch's allocator would otherwise hand
    it out again on the default stream once the caller frees it). Nothing waits where the two
    are one stream, or on the host."""
    if tensor.is_cuda and not on_default_stream(tensor):
        current = torch.cuda.current_stream(tensor.device)
        current.wait_stream(torch.cuda.default_stream(tensor.device))
        tensor.record_stream(current)
    return tensor


def _stream_id(index: int) -> int:
    """Return the id of torch's current stream on GPU `index`."""
    if _current_stream is None:
        return torch.cuda.current_stream(index).cuda_stream
    return _current_stream(index)[0]


def on_default_stream(tensor: torch.Tensor) -> bool:
    """Return whether torch's current stream on `tensor`'s GPU is its default stream."""
    return _default_is_current(tensor.get_device())


def _default_is_current(index: int) -> bool:
    """Return whether torch's current stream on GPU `index` is its default stream."""
    if _current_stream is None or _default_stream is None:
        return torch.cuda.current_stream(index) == torch.cuda.default_stream(index)
    return _current_stream(index)[0] == _default_stream(index)[0]


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
