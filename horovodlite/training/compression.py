"""Wire compression for gradients: the Compressor protocol and the casting compressors.

What differs per framework is only how it casts, what its 16-bit float dtypes are called and how
it tells a floating dtype; a binding states those in one `Casts` and gets Horovod's
`Compression.none/.fp16/.bf16` from `compression_namespace`.
"""

import dataclasses
import operator
from typing import Any, Callable

__all__ = [
    "Compressor",
    "NoneCompressor",
    "CastCompressor",
    "Casts",
    "compression_namespace",
]


class Compressor:
    """A compression strategy: `compress(tensor) -> (tensor, ctx)`, `decompress(tensor, ctx)`.

    Strategies are classes used without instances, as in Horovod; subclass this for your own.
    """

    @staticmethod
    def compress(tensor):
        """Return `tensor` as it should travel, and what decompress() needs to restore it."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Return the reduced `tensor` restored with the `ctx` that compress() gave."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


@dataclasses.dataclass(frozen=True)
class Casts:
    """How one framework casts tensors: all a CastCompressor needs to know about it.

    Attributes:
        cast: `cast(tensor, dtype)` returns the tensor converted to `dtype`.
        is_floating: `is_floating(dtype)` tells a floating dtype, the only kind that is cast.
        dtype_of: `dtype_of(tensor)` returns the tensor's dtype, as `cast` and `is_floating`
            take it (default: its `.dtype`).
    """

    cast: Callable[[Any, Any], Any]
    is_floating: Callable[[Any], bool]
    dtype_of: Callable[[Any], Any] = operator.attrgetter("dtype")


class CastCompressor(Compressor):
    """Send floating tensors as `wire_dtype` and cast them back after; send others as they are.

    A subclass sets `wire_dtype` and the framework's `casts`.
    """

    wire_dtype: Any
    casts: Casts

    @classmethod
    def compress(cls, tensor):
        # Only floating tensors are cast; integers would lose their meaning.
        dtype = cls.casts.dtype_of(tensor)
        if cls.casts.is_floating(dtype) and dtype != cls.wire_dtype:
            return cls.casts.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else cls.casts.cast(tensor, ctx)


_CAST_DOCS = {
    "FP16Compressor": "Send floating tensors as float16 (half the bytes; range up to 65504).",
    "BF16Compressor": (
        "Send floating tensors as bfloat16 (half the bytes, float32's range, 8 bits of mantissa)."
    ),
}


def _cast_compressor(name: str, wire_dtype, casts: Casts, module: str) -> type:
    # `module` is the binding's compression module, which exports the class under `name`:
    # so its repr names the binding, and pickle finds it there.
    namespace = {"wire_dtype": wire_dtype, "casts": casts, "__doc__": _CAST_DOCS[name]}
    namespace["__module__"] = module
    return type(name, (CastCompressor,), namespace)


def compression_namespace(casts: Casts, *, float16, bfloat16, module: str) -> type:
    """Return Horovod's `Compression` namespace (none, fp16, bf16) for one framework.

    Args:
        casts: the framework's casting functions.
        float16, bfloat16: the framework's names for those dtypes, as `casts` takes them.
        module: the module that exports the result's `fp16` and `bf16` classes as
            FP16Compressor and BF16Compressor (the binding's compression module: `__name__`).
    """

    class Compression:
        """The compression strategies, as Horovod names them."""

        none = NoneCompressor
        fp16 = _cast_compressor("FP16Compressor", float16, casts, module)
        bf16 = _cast_compressor("BF16Compressor", bfloat16, casts, module)

    Compression.__module__ = module
    return Compression
