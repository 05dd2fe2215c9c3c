"""SyncBatchNormalization: a Keras batch normalization whose batch statistics span all ranks."""

import keras

import horovodlite as core
import tensorflow as tf
from horovodlite.ops import ReduceOp

from .mpi_ops import allreduce

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization with the mean and variance of the whole global batch in training.

    Each rank all-reduces, per channel, its element count and its sums of x and x^2, so the
    statistics are those of the concatenated batch even when the ranks' batches differ in size
    (Horovod averages the ranks' moments, which assumes equal batches). The gradient flows
    through the all-reduce, as in Horovod. Inference uses the moving statistics, which are then
    equal on every rank. Needs the tensorflow Keras backend (torch: horovodlite.torch's
    SyncBatchNorm).

    Raises:
        ValueError: fused is True or None (as Horovod: the fused kernel computes the moments
            itself, where they cannot be synchronized).
        NotImplementedError: the Keras backend is not tensorflow.
    """

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True: pass fused=False")
        if keras.backend.backend() != "tensorflow":
            raise NotImplementedError(
                "horovodlite.tensorflow.SyncBatchNormalization needs KERAS_BACKEND=tensorflow; "
                f"with {keras.backend.backend()!r} use horovodlite.torch.SyncBatchNorm"
            )
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        mean, variance = super()._moments(inputs, mask)
        if core.size() == 1:
            return mean, variance
        channels = tf.size(mean)
        if mask is None:
            count = tf.cast(tf.size(inputs) // channels, mean.dtype)
        else:
            weights = tf.broadcast_to(
                tf.cast(tf.expand_dims(mask, -1), mean.dtype), tf.shape(inputs)
            )
            count = tf.reduce_sum(weights) / tf.cast(channels, mean.dtype)
        # multiply_no_nan: a rank with an empty batch (mean NaN) adds zeros.
        stats = tf.concat(
            [
                tf.reshape(tf.math.multiply_no_nan(mean, count), [-1]),
                tf.reshape(tf.math.multiply_no_nan(variance + tf.square(mean), count), [-1]),
                tf.reshape(count, [1]),
            ],
            axis=0,
        )
        total = allreduce(stats, op=ReduceOp.SUM, name=None)
        global_mean = total[:channels] / total[-1]
        global_square = total[channels : 2 * channels] / total[-1]
        global_variance = tf.maximum(global_square - tf.square(global_mean), 0.0)
        shape = tf.shape(mean)
        return tf.reshape(global_mean, shape), tf.reshape(global_variance, shape)
