"""horovodlite.tensorflow.keras: Horovod's module path for Keras, the same API as horovodlite.keras.

`import horovod.tensorflow.keras as hvd` becomes `import horovodlite.tensorflow.keras as hvd`:
every name is horovodlite.keras's own object (`hvd.DistributedOptimizer is
horovodlite.keras.DistributedOptimizer`), so the two paths can be mixed in one program.
"""

from horovodlite.keras import *  # noqa: F403

from horovodlite import keras as _keras

# Importing the submodule makes `callbacks` this package's one: the same callback classes
# under Horovod's path horovod.tensorflow.keras.callbacks (and `elastic` likewise).
from . import callbacks, elastic  # noqa: F401

__all__ = list(_keras.__all__)
