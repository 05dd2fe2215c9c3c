"""Gradient compression on TensorFlow tensors: the training layer's compressors with tf.cast."""

import tensorflow as tf
from horovodlite.training import Casts, Compressor, NoneCompressor, compression_namespace

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]

Compression = compression_namespace(
    Casts(cast=tf.cast, is_floating=lambda dtype: dtype.is_floating),
    float16=tf.float16,
    bfloat16=tf.bfloat16,
    module=__name__,
)
FP16Compressor, BF16Compressor = Compression.fp16, Compression.bf16
