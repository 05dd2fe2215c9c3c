"""A framework's tensors as the core moves them without a numpy or CuPy view.

Where a transport moves a framework's own tensors (torch's gloo and NCCL groups take torch's),
the core hands them to it as they are: no view, no DLPack round trip. The binding tells the
core how to handle its tensors with a `TensorKind`; the core decides everything else (the
check, the route, the batch's order, the scaling), so a tensor on its way and an array on the
general way are reduced alike, element for element, and ranks on either way meet.

Used by the short all-reduce (small_allreduce.tensor_allreduce) and by the engine's fused
batches (fusion.TensorEntry).
"""

from typing import Optional

__all__ = ["TensorKind", "Described", "device_tensors", "use_device_tensors"]


class TensorKind:
    """What the core needs to know of a framework's tensors to move them as they are.

    A binding whose transport moves its tensors as they are implements every method with the
    framework's own calls.
    """

    def describe(self, tensor):
        """Return (numpy dtype, shape tuple, whether on the host) of `tensor`, or None for a
        dtype that only the general way takes."""
        raise NotImplementedError

    def contiguous(self, tensor) -> bool:
        """Return whether `tensor` lies in its memory in its logical order, one element after
        another: what a transport reduces where it lies."""
        raise NotImplementedError

    def joinable(self, tensor) -> bool:
        """Return whether join() takes `tensor` into a batch (in its logical order) and split()
        writes its result back: a contiguous tensor, or one the framework lays out densely in
        another order (torch's channels_last), which they copy in and out."""
        return self.contiguous(tensor)

    def carried_by(self, transport) -> bool:
        """Return whether `transport` moves these tensors as they are."""
        raise NotImplementedError

    def empty_like(self, tensor):
        raise NotImplementedError

    def new(self, like, count: int):
        """Return a new flat tensor of `count` elements of `like`'s dtype, on its device."""
        raise NotImplementedError

    def flat(self, tensor):
        """Return a 1-D view of a contiguous tensor."""
        raise NotImplementedError

    def scale(self, tensor, factor: float) -> None:
        """Multiply a float tensor by `factor` in place, rounding as the general way's
        staging.scale does wherever scales_alike() says so."""
        raise NotImplementedError

    def scales_alike(self, dtype) -> bool:
        """Return whether scale(), join() and split() round a tensor of numpy `dtype`, on the
        host and on a GPU, as staging.scale rounds its view, bit for bit: only such tensors
        travel as they are with a factor, so that a batch reduced through views on another rank
        gives the same results."""
        raise NotImplementedError

    def allreduce(self, transport, comm, out, source, op) -> None:
        """Reduce `source` (or `out` itself, where None) into `out` with `op` (a Sum, Min, Max
        or Product) over `comm`, whose ranks number more than one, on `transport` (one that
        carries these tensors); `out` is contiguous and not empty."""
        raise NotImplementedError

    def join(self, tensors: list, prescale: float, reused: bool) -> tuple:
        """Return (buffer, parts): a flat tensor holding the joinable `tensors` one after
        another, times `prescale` (a float tensor's, where not 1), filled in one call (a fused
        batch's buffer), and what split() needs of the tensors (where each lies in the buffer,
        their flat views: the kind's own, the core only hands it on). `reused`: every result is
        copied out of the buffer (all in place), so its memory may be the last batch's, kept
        for this; else the results are views of it, and it is new."""
        raise NotImplementedError

    def split(self, buffer, parts, tensors: list, inplace: list, factor: float) -> list:
        """Return each of `tensors`' results from the reduced `buffer` (join's, with its
        `parts`), times `factor`: copied into the tensor itself where `inplace` says so, else a
        view of `buffer` shaped as the tensor."""
        raise NotImplementedError

    def zeros(self, dtype, shape: tuple):
        """Return a tensor of zeros of numpy `dtype` and `shape` on this process's current GPU:
        a joined rank's part in an all-reduce of GPU data that no CuPy array can hold
        (fusion.zeros_entry)."""
        raise NotImplementedError

    def to_core(self, tensor):
        """Return `tensor` as a numpy or CuPy array (its memory, for the general way)."""
        raise NotImplementedError

    def from_core(self, array, tensor, inplace: bool):
        """Return the general way's result `array` as the result for `tensor`."""
        raise NotImplementedError


class Described:
    """A tensor's numpy dtype and shape, as the agreement's fields and the checks read an array's
    (agreement.array_fields)."""

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype, shape: tuple):
        self.dtype, self.shape = dtype, shape

    @property
    def ndim(self) -> int:
        return len(self.shape)


# The kind whose tensors hold GPU data that no CuPy array can (bfloat16, or CuPy missing): a
# binding whose transport moves such tensors as they are lends it (the torch binding does).
_device_tensors: Optional[TensorKind] = None


def use_device_tensors(kind: Optional[TensorKind]) -> None:
    """Make `kind` the one whose zeros a joined rank contributes to all-reduces of GPU data that
    no CuPy array can hold (None: none)."""
    global _device_tensors
    _device_tensors = kind


def device_tensors() -> Optional[TensorKind]:
    """Return the kind use_device_tensors() lent, or None."""
    return _device_tensors
