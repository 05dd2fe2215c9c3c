"""horovodlite.training: what every framework binding needs beyond the collectives.

Framework-neutral: it imports core modules only, never torch, tensorflow or keras. The bindings
keep only the glue to their framework (casts, tensors, hooks) and take the rest from here.
`common` (the core names every binding re-exports) is imported by the bindings themselves.
"""

from . import compression, finishing, grouping, locality, reduction
from .compression import *  # noqa: F403
from .finishing import *  # noqa: F403
from .grouping import *  # noqa: F403
from .locality import *  # noqa: F403
from .reduction import *  # noqa: F403

__all__ = []
__all__ += compression.__all__
__all__ += reduction.__all__
__all__ += grouping.__all__
__all__ += locality.__all__
__all__ += finishing.__all__
