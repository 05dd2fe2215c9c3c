"""`python -m horovodlite.run`: the same as the horovodlite-run console script."""

import sys

from . import main

sys.exit(main())
