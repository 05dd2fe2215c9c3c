"""horovodlite: data-parallel training collectives over MPI, in pure Python.

This module only re-exports the public API; docs/architecture.md says where each part lives.
"""

from . import asynchronous, collectives, grouped
from .asynchronous import *  # noqa: F403
from .collectives import *  # noqa: F403
from .exceptions import MismatchError, NotInitializedError
from .grouped import *  # noqa: F403
from .runtime import cuda_aware_mpi
from .training import common
from .training.common import *  # noqa: F403

# The names every binding shares, then those of the numpy API alone.
__all__ = list(common.__all__)
__all__ += collectives.__all__
__all__ += grouped.__all__
__all__ += [name for name in asynchronous.__all__ if name not in common.__all__]
__all__ += ["cuda_aware_mpi", "MismatchError", "NotInitializedError"]


def __getattr__(name):
    # `horovodlite.run(fn, np=2)` as `horovod.run`: the launcher package, imported on first use
    # (it is callable); importing it sets this attribute, so this runs once.
    if name == "run":
        import importlib

        return importlib.import_module(".run", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
