"""Gradient compression on torch tensors: the training layer's compressors with torch's casts."""

import torch
from horovodlite.training import Casts, Compressor, NoneCompressor, compression_namespace

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]

Compression = compression_namespace(
    Casts(cast=torch.Tensor.to, is_floating=lambda dtype: dtype.is_floating_point),
    float16=torch.float16,
    bfloat16=torch.bfloat16,
    module=__name__,
)
FP16Compressor, BF16Compressor = Compression.fp16, Compression.bf16
