"""horovodlite-run: the launcher, its host lists, MPI command lines and the simulated cluster.

The package is also callable, as Horovod's `horovod.run(fn, args, np=...)`: see function.py.
"""

import sys
import types

from .cli import main
from .errors import LaunchError
from .function import run

__all__ = ["LaunchError", "main", "run"]


class _CallableModule(types.ModuleType):
    """`horovodlite.run` is both this package (python -m horovodlite.run) and Horovod's run()."""

    def __call__(self, *args, **kwargs):
        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
