"""One rank of horovodlite.run(fn): run the function, store what it returns.

python -m mpi4py -m horovodlite.run.function_rank PAYLOAD FOLDER (started by function.py).
"""

import os
import pickle
import sys

import cloudpickle


def main(payload: str, folder: str) -> None:
    """Run the pickled function of `payload`; write its result to FOLDER/result.RANK.pkl."""
    with open(payload, "rb") as f:
        func, args, kwargs = pickle.load(f)
    result = func(*args, **kwargs)
    from mpi4py import MPI  # after func: its horovodlite.init() may already have started MPI

    path = os.path.join(folder, f"result.{MPI.COMM_WORLD.Get_rank()}.pkl")
    with open(path + ".part", "wb") as f:
        cloudpickle.dump(result, f)
    os.replace(path + ".part", path)  # complete or absent, never half written


if __name__ == "__main__":
    main(*sys.argv[1:3])
