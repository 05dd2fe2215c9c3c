"""horovodlite-run: the launcher, its host lists, MPI command lines and the simulated cluster."""

from .cli import main
from .errors import LaunchError

__all__ = ["LaunchError", "main"]
