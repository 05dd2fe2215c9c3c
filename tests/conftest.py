import os
import sys

# tests/ holds helper modules (mpirun.py) that the tests import by name.
sys.path.insert(0, os.path.dirname(__file__))
