"""Gradient compression for the wire, on any Keras backend: cast before, cast back after."""

import keras

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]


class Compressor:
    """A compression strategy: `compress(tensor) -> (tensor, ctx)`, `decompress(tensor, ctx)`."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    wire_dtype: str

    @classmethod
    def compress(cls, tensor):
        # Only floating tensors are cast; integers would lose their meaning.
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if "float" in dtype and dtype != cls.wire_dtype:
            return keras.ops.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else keras.ops.cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Send floating tensors as float16 (half the bytes; range up to 65504)."""

    wire_dtype = "float16"


class BF16Compressor(_CastCompressor):
    """Send floating tensors as bfloat16 (half the bytes, float32's range, 8 bits of mantissa)."""

    wire_dtype = "bfloat16"


class Compression:
    """The compression strategies, as Horovod names them."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
