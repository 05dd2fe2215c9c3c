"""Working buffers: where an algorithm runs, and how its result gets back to the caller.

An algorithm runs on one flat contiguous buffer. Host arrays are used in place where that is
allowed, else copied; GPU arrays stay on the GPU when the transport that moves them carries GPU
buffers (NCCL, a CUDA-aware MPI; transport.py) and are staged through host memory when it does
not: through a reused page-locked (pinned) host buffer, which the GPU copies to and from at the
link's speed, where pageable memory takes a bounce through a driver buffer (docs/gpu.md).
"""

import threading

import numpy as np

from .buffers import synchronize_device
from .ops import half_kernels_for
from .result_memory import new_array

__all__ = [
    "staged",
    "flat_work",
    "copy_in",
    "host_scratch",
    "result_buffer",
    "in_pieces",
    "through_host_in_pieces",
    "deliver",
    "hand_back",
    "copy_parts",
    "scale",
]


def staged(xp, transport) -> bool:
    """Return whether GPU data must go through host memory (`transport` takes no GPU buffers)."""
    return xp is not np and not transport.device


def flat_work(array, xp, copy: bool, transport):
    """Return (flat contiguous buffer, its module) for `transport` to move."""
    if staged(xp, transport):
        return _to_host(array, xp), np
    if not copy and array.flags.c_contiguous:
        buf = array.reshape(-1)
    else:
        buf = xp.array(array, copy=True, order="C").reshape(-1)
    if transport.host_reads:
        synchronize_device(xp)  # MPI reads GPU memory from the host; NCCL's stream is ordered
    return buf, xp


def copy_in(dest, arrays: list, xp, prescale: float) -> None:
    """Copy `arrays` (of module `xp`) one after another into the flat `dest`, times `prescale`.

    `dest` is of module `xp`, or a host array where GPU arrays are staged: those are joined on
    the GPU first and cross to the host in one copy.
    """
    staging = xp is not np and type(dest) is np.ndarray  # (our own pinned buffer)
    module = xp if not staging else np
    if xp is np and prescale == 1.0:
        # One call, not one slice assignment each; numpy flattens them itself (axis None), at
        # half the cost of a reshape each for 1-D arrays.
        np.concatenate(arrays, axis=None, out=dest)
        return
    if module is not np and _gathered(dest, arrays, xp, prescale):
        return
    flat = [array.reshape(-1) for array in arrays]
    if staging:
        joined = flat[0] if len(flat) == 1 else xp.concatenate(flat)
        joined.get(out=dest)
        scale(np, dest, prescale)
    elif prescale == 1.0:
        module.concatenate(flat, out=dest)
    else:
        offset = 0
        for part in flat:
            target = dest[offset : offset + part.size]
            _multiply(module, part, prescale, target)
            offset += part.size


def _gathered(dest, arrays: list, xp, prescale: float) -> bool:
    """Copy GPU `arrays` into `dest` in one launch (copy_parts) if they are all contiguous."""
    if len(arrays) < 2 or not all(array.flags.c_contiguous for array in arrays):
        return False  # (one array: CuPy's own copy is one launch too)
    sources, targets, counts = [], [], []
    address, itemsize = dest.data.ptr, dest.dtype.itemsize
    for array in arrays:
        size = array.size
        sources.append(array.data.ptr)
        targets.append(address)
        counts.append(size)
        address += size * itemsize
    return copy_parts(xp, dest.dtype, sources, targets, counts, prescale)


# Per thread: `buffers`, {(role, dtype): a pinned host buffer}; `uploaded`, the event after
# the thread's last copy up to the GPU, and `pending`, whether that copy may still be running.
_pinned = threading.local()


def host_scratch(xp, dtype, count: int, role: str = "fusion"):
    """Return a reused flat host array of `count` elements for staging arrays of CuPy (`xp`).

    It is page-locked (pinned) memory, one per thread, `role` and dtype, grown to the largest
    size asked so far; the GPU copies to and from it at the link's speed, where pageable memory
    bounces through a driver buffer (a tenth of the speed, measured on the H100: docs/gpu.md).
    The roles are the buffers that one collective holds at once: "fusion" (a fused batch,
    fusion.py), "work" (flat_work's copy of an input) and "result" (result_buffer). Copies up
    from them run on the GPU after the host has moved on, so the host first waits for the
    thread's last one: no buffer is handed out (or let go) while a copy may still read it.
    """
    if getattr(_pinned, "pending", False):
        _pinned.uploaded.synchronize()
        _pinned.pending = False
    cache = getattr(_pinned, "buffers", None)
    if cache is None:
        cache = _pinned.buffers = {}
    key = (role, dtype.str, dtype.name)
    held = cache.get(key)
    if held is None or held.size < count:
        memory = xp.cuda.alloc_pinned_memory(max(count, 1) * dtype.itemsize)
        held = cache[key] = np.frombuffer(memory, dtype=dtype, count=max(count, 1))
    return held[:count]


def _queued_up(xp) -> None:
    """Record the event after the copy up to the GPU just queued on the current stream."""
    if getattr(_pinned, "uploaded", None) is None:
        _pinned.uploaded = xp.cuda.Event(block=False, disable_timing=True)
    _pinned.uploaded.record()
    _pinned.pending = True


def result_buffer(module, xp, count: int, dtype):
    """Return a flat array of `count` elements for a result that a transport writes: a new one
    of `module`, or, where GPU arrays (of `xp`) are staged through host memory (`module` is
    numpy), the thread's reused pinned "result" buffer, which deliver() copies up to a new GPU
    array."""
    if module is xp:
        return new_array(module, count, dtype)
    return host_scratch(xp, dtype, count, "result")


def _to_host(array, xp):
    """Copy GPU `array` into the thread's pinned "work" buffer; return that, flat.

    The copy runs on the current stream, after the work queued there, and the host waits for it
    (CuPy's `get`): the host reads the buffer next."""
    host = host_scratch(xp, array.dtype, array.size, "work")
    if array.size:
        array.get(out=host.reshape(array.shape))
    return host


def _to_device(host, xp, into=None):
    """Copy the host array `host` up to the GPU: into the GPU array `into` where given (of its
    shape), else into a new one; return the GPU array.

    The copy is queued on the current stream (CuPy's `set`), so the host does not wait for it;
    host_scratch does, before the pinned buffers are written again."""
    if into is not None and into.flags.c_contiguous:
        target = into
    else:
        target = xp.empty(host.shape, dtype=host.dtype)
    if host.size:
        target.set(host)
        _queued_up(xp)
    if into is not None and target is not into:
        into[...] = target
        return into
    return target


# A staged all-reduce of at least two of these moves in pieces of this many bytes (fusion.py).
PIECE_BYTES = 8 << 20


def in_pieces(nbytes: int) -> bool:
    """Return whether a staged all-reduce of `nbytes` moves in pieces (two or more)."""
    return nbytes >= 2 * PIECE_BYTES


def through_host_in_pieces(source, target, xp, move) -> None:
    """Move the flat GPU array `source` down to the thread's pinned host buffer, let
    `move(part)` work on each piece there in place (the transport's all-reduce of it), and copy
    the results up into the flat GPU array `target` (which may be `source`), piece by piece.

    Every copy down is queued on the current stream at once, each followed by an event; the
    host waits only for its piece's event before moving that piece, then queues its copy up. So
    the GPU copies the next pieces down, and the last ones up, while the transport moves this
    one (the copies up follow all the copies down on the stream, so an in-place `target` is
    read before it is written). Every rank cuts the same pieces: they follow from the size.
    """
    host = host_scratch(xp, source.dtype, source.size)
    step = max(1, PIECE_BYTES // source.dtype.itemsize)
    bounds = [(start, min(start + step, source.size)) for start in range(0, source.size, step)]
    arrived = []
    for start, stop in bounds:
        source[start:stop].get(out=host[start:stop], blocking=False)
        arrived.append(xp.cuda.Event(block=False, disable_timing=True))
        arrived[-1].record()
    for (start, stop), event in zip(bounds, arrived):
        event.synchronize()
        move(host[start:stop])
        target[start:stop].set(host[start:stop])
    _queued_up(xp)


def deliver(buf, array, xp, inplace: bool, shape=None, factor: float = 1.0):
    """Hand `buf` back shaped as `shape`: as a new array, or written into `array` if in place.

    A `factor` other than 1 multiplies the result on the way (as scale() rounds); `buf` is then
    the fusion code's own memory, which it may scale in place.
    """
    out = buf.reshape(array.shape if shape is None else shape)
    if factor != 1.0:
        if inplace and type(out) is type(array) and not _same_memory(out, array):
            module = np if isinstance(out, np.ndarray) else xp
            _multiply(module, out, factor, array)
            return array
        scale(np if isinstance(out, np.ndarray) else xp, out, factor)
    if xp is not np and isinstance(out, np.ndarray):
        return _to_device(out, xp, array if inplace else None)  # a staged result
    if not inplace:
        return out
    if not _same_memory(out, array):
        array[...] = out
    return array


# One launch copies every part of a GPU batch, into the fusion buffer or back out of it, where
# one copy each costs a launch and CuPy's Python around it (its slices, reshapes and
# concatenate): 161 of each for ResNet-50's gradients. Block row y copies part y, given by
# addresses; T is the element type (an unsigned integer of its width for plain copies).
_COPY_PARTS = r"""
extern "C" __global__
void copy_parts(const unsigned long long* table, int n, T factor, int scaled) {
    const int part = blockIdx.y;
    const T* source = (const T*)table[part];
    T* target = (T*)table[n + part];
    const long long count = (long long)table[2 * n + part];
    const long long step = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += step) {
        target[i] = scaled ? (T)(source[i] * factor) : source[i];
    }
}
"""
_PLAIN_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
_SCALED_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_kernels: dict = {}


def copy_parts(xp, dtype, sources: list, targets: list, counts: list, factor: float = 1.0) -> bool:
    """Copy `counts[i]` elements of `dtype` from GPU address `sources[i]` to `targets[i]`, for
    every i, times `factor`, in one kernel launch on CuPy's (`xp`) current stream; return False,
    having copied nothing, where it cannot (a factor on a type other than float32 and float64):
    copy each part then.

    The factor is applied in the dtype's own precision, as scale() does.
    """
    scaled = factor != 1.0
    name = _SCALED_TYPES.get(dtype) if scaled else _PLAIN_TYPES.get(dtype.itemsize)
    n = len(counts)
    if name is None or not 0 < n <= 65535:  # (65535: the most block rows a grid has)
        return False
    kernel = _kernels.get(name)
    if kernel is None:
        kernel = _kernels[name] = xp.RawKernel(f"typedef {name} T;\n{_COPY_PARTS}", "copy_parts")
    table = np.array(sources + targets + counts, dtype=np.uint64)
    blocks = min((max(counts) + 255) // 256, 1024)
    value = dtype.type(factor) if scaled else np.dtype(f"u{dtype.itemsize}").type(0)
    kernel((max(blocks, 1), n), (256,), (xp.asarray(table), np.int32(n), value, np.int32(scaled)))
    return True


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
        _multiply(xp, buf, factor, buf)


def _multiply(xp, source, factor: float, out) -> None:
    """`out` = `source` * `factor`, rounded as scale() says; a framework's vectorized kernels
    take large host half-type arrays where a binding lent them (ops.use_half_kernels)."""
    kernels = half_kernels_for(out, source) if xp is np else None
    if kernels is not None:
        kernels.multiply(source, factor, out)
        return
    xp.multiply(source, _factor_type(xp, source.dtype)(factor), out=out, casting="unsafe")


def _factor_type(xp, dtype):
    if dtype.kind != "f" and dtype.name != "bfloat16":
        return np.float64
    if dtype.itemsize == 2 and xp is np:
        return np.float32
    return dtype.type


def hand_back(entries: list, layout, module, factor: float, span) -> list:
    """Hand each entry of a batch its result as its layout (fusion.Layout) says: the array
    itself, a view of the layout's buffer, or a copy back into it (`factor` on the way), on
    arrays of `module`; `span(phase)` times the copies (the timeline)."""
    buffer, offsets, copy_back = layout.buffer, layout.offsets, layout.copy_back
    if not any(copy_back):  # (one loop, no call a result: a batch may hold 200 small ones)
        results = []
        for entry, start in zip(entries, offsets):
            array = entry.array
            if start is None:
                results.append(array)
                continue
            part = buffer[start : start + array.size]
            results.append(part if array.ndim == 1 else part.reshape(array.shape))
        return results
    with span("MEMCPY_OUT_FUSION_BUFFER"):
        together = module is not np and _delivered_together(entries, layout, module, factor)
        results = []
        for entry, start, back in zip(entries, offsets, copy_back):
            array = entry.array
            if start is None or (together and back):
                results.append(array)
                continue
            part = buffer[start : start + array.size]
            if back:
                results.append(deliver(part, array, entry.xp, entry.inplace, factor=factor))
            else:
                results.append(_shaped(part, array))
    return results


def _shaped(part, array):
    """Return the flat `part` shaped as `array` (as it is where `array` is flat: a batch of
    small results is mostly biases and norms, and a reshape each costs as much as the slice)."""
    return part if array.ndim == 1 else part.reshape(array.shape)


def _delivered_together(entries: list, layout, module, factor: float) -> bool:
    """Copy a GPU batch's results back into their in-place arrays in one launch, if it can
    (staging.copy_parts: contiguous arrays, and a factor only on float32 and float64); a single
    array takes the one copy deliver() makes."""
    back = [i for i, flag in enumerate(layout.copy_back) if flag]
    arrays = [entries[i].array for i in back]
    if len(arrays) < 2 or not all(array.flags.c_contiguous for array in arrays):
        return False
    start, itemsize = layout.buffer.data.ptr, layout.buffer.dtype.itemsize
    sources = [start + layout.offsets[i] * itemsize for i in back]
    targets = [array.data.ptr for array in arrays]
    counts = [array.size for array in arrays]
    return copy_parts(module, arrays[0].dtype, sources, targets, counts, factor)
