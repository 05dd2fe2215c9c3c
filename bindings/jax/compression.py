"""Gradient compression on jax.Arrays: the training layer's compressors with JAX's casts.

The casts are JAX operations, so they run inside `jax.jit` and are differentiable.
"""

import numpy as np

import jax.numpy as jnp
from horovodlite.training import Casts, Compressor, NoneCompressor, compression_namespace

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]

Compression = compression_namespace(
    Casts(
        cast=lambda array, dtype: array.astype(dtype),
        is_floating=lambda dtype: jnp.issubdtype(dtype, jnp.floating),
    ),
    float16=np.dtype(jnp.float16),
    bfloat16=np.dtype(jnp.bfloat16),
    module=__name__,
)
FP16Compressor, BF16Compressor = Compression.fp16, Compression.bf16
