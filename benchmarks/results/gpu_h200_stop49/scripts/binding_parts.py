"""What the torch binding's pieces cost per call on a CUDA tensor (µs, best of 5 x 20000)."""

import timeit

import cupy
import horovodlite.torch as hvd
import numpy as np
import torch
from horovodlite.torch import tensors as T

hvd.init()
torch.cuda.set_device(0)
t = torch.randn(1024, device="cuda")
g = torch.randn(64, 3, 7, 7, device="cuda")
view = T.TensorView(t)
mem = cupy.cuda.UnownedMemory(t.data_ptr(), 4096, t, 0)
ptr = cupy.cuda.MemoryPointer(mem, 0)
dt = np.dtype(np.float32)
cases = {
    "TensorView(t)": lambda: T.TensorView(t),
    "TensorView(4-d grad)": lambda: T.TensorView(g),
    "_cupy_view(t)": lambda: T._cupy_view(t),
    "write_back": lambda: view.write_back(view.array),
    "cupy.ndarray(shape, dtype, ptr)": lambda: cupy.ndarray((1024,), dt, ptr),
    "cupy.ndarray(4-d)": lambda: cupy.ndarray((64, 3, 7, 7), dt, ptr),
    "UnownedMemory": lambda: cupy.cuda.UnownedMemory(t.data_ptr(), 4096, t, 0),
    "MemoryPointer": lambda: cupy.cuda.MemoryPointer(mem, 0),
    "get_current_stream().ptr": lambda: cupy.cuda.get_current_stream().ptr,
    "_default_is_current(0)": lambda: T._default_is_current(0),
    "t.numel/get_device/is_contiguous/data_ptr": lambda: (
        t.numel(),
        t.get_device(),
        t.is_contiguous(),
        t.data_ptr(),
    ),
    "increment_version": lambda: torch.autograd.graph.increment_version(t),
    "cupy array .data.ptr": lambda: view.array.data.ptr,
    "cupy array .flags.c_contiguous": lambda: view.array.flags.c_contiguous,
    "cupy slice buf[3:900]": lambda: view.array[3:900],
    "cupy reshape(-1)": lambda: view.array.reshape(-1),
    "cupy.asarray(np 483 u64)": lambda: cupy.asarray(np.zeros(483, np.uint64)),
}
for name, fn in cases.items():
    n = 20000
    best = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
    print(f"BINDING {name}: {best:.2f} us", flush=True)
hvd.shutdown()
