"""horovodlite.tensorflow.keras.callbacks: Horovod's module path for horovodlite.keras.callbacks."""

from horovodlite.keras import callbacks as _callbacks
from horovodlite.keras.callbacks import *  # noqa: F403

__all__ = list(_callbacks.__all__)
