"""Gradient compression on any Keras backend: the training layer's compressors with keras.ops.

Keras names dtypes by strings ("float32"), which `standardize_dtype` reads off any backend's
tensor, and `keras.ops.cast` casts on every backend.
"""

import keras
from horovodlite.training import Casts, Compressor, NoneCompressor, compression_namespace

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]

Compression = compression_namespace(
    Casts(
        cast=keras.ops.cast,
        is_floating=lambda dtype: "float" in dtype,
        dtype_of=lambda tensor: keras.backend.standardize_dtype(tensor.dtype),
    ),
    float16="float16",
    bfloat16="bfloat16",
    module=__name__,
)
FP16Compressor, BF16Compressor = Compression.fp16, Compression.bf16
