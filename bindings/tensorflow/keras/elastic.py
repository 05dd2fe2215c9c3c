"""horovodlite.tensorflow.keras.elastic: Horovod's module path for horovodlite.keras.elastic."""

from horovodlite.keras import elastic as _elastic
from horovodlite.keras.elastic import *  # noqa: F403

__all__ = list(_elastic.__all__)
