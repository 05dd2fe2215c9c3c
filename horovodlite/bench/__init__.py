"""Collective benchmarks: horovodlite's algorithms against the MPI library and torch's Gloo.

Run `python -m horovodlite.bench --help`; the method is in method.py, the contenders in
peers.py, and docs/benchmarks.md shows results.
"""

from .cli import main

__all__ = ["main"]
