"""Working buffers: where an algorithm runs, and how its result gets back to the caller.

An algorithm runs on one flat contiguous buffer. Host arrays are used in place where that is
allowed, else copied; GPU arrays stay on the GPU when the transport that moves them carries GPU
buffers (NCCL, a CUDA-aware MPI; transport.py) and are staged through host memory when it does
not.
"""

import numpy as np

from .buffers import synchronize_device

__all__ = ["staged", "flat_work", "deliver", "scale", "scaled_copy"]


def staged(xp, transport) -> bool:
    """Return whether GPU data must go through host memory (`transport` takes no GPU buffers)."""
    return xp is not np and not transport.device


def flat_work(array, xp, copy: bool, transport):
    """Return (flat contiguous buffer, its module) for `transport` to move."""
    if staged(xp, transport):
        return xp.asnumpy(array).reshape(-1), np
    if not copy and array.flags.c_contiguous:
        buf = array.reshape(-1)
    else:
        buf = xp.array(array, copy=True, order="C").reshape(-1)
    synchronize_device(xp)
    return buf, xp


def deliver(buf, array, xp, inplace: bool, shape=None):
    """Hand `buf` back shaped as `shape`: as a new array, or written into `array` if in place."""
    out = buf.reshape(array.shape if shape is None else shape)
    if xp is not np and isinstance(out, np.ndarray):
        out = xp.asarray(out)
    if not inplace:
        return out
    if not _same_memory(out, array):
        array[...] = out
    return array


def _same_memory(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return np.shares_memory(a, b)
    return a.data.ptr == b.data.ptr


def scale(xp, buf, factor: float) -> None:
    """Multiply `buf` by `factor` in place (nothing for 1.0), rounding as Horovod does.

    A float buffer is scaled in its own precision, with the factor cast to it; half types on
    the host in float32 math (as Horovod's CPU kernels). Integers scale in float64 and truncate
    toward zero (the unsafe cast back).
    """
    if factor != 1.0:
        xp.multiply(buf, _factor_type(xp, buf.dtype)(factor), out=buf, casting="unsafe")


def scaled_copy(xp, buf, factor: float, target=None):
    """Return `buf` times `factor` (as scale() rounds), written into `target` where it is a
    contiguous array of `buf`'s dtype, else into a new array."""
    contiguous = target is not None and target.flags.c_contiguous and target.dtype == buf.dtype
    out = target.reshape(-1) if contiguous else xp.empty_like(buf)
    if factor == 1.0:
        out[...] = buf
    else:
        xp.multiply(buf, _factor_type(xp, buf.dtype)(factor), out=out, casting="unsafe")
    return out


def _factor_type(xp, dtype):
    if dtype.kind != "f" and dtype.name != "bfloat16":
        return np.float64
    if dtype.itemsize == 2 and xp is np:
        return np.float32
    return dtype.type
