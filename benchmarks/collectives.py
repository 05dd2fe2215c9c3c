"""Collective benchmarks (the same as `python -m horovodlite.bench`): see benchmarks/README.md.

    python benchmarks/collectives.py --np 4
    python benchmarks/collectives.py --simulated-hosts 4,8 --link-rate 1gbit \
        --collectives allreduce --contenders ring,naive,mpi
"""

import sys

from horovodlite.bench import main

if __name__ == "__main__":
    sys.exit(main())
