"""horovodlite.lightning: a PyTorch Lightning strategy that trains data-parallel on horovodlite.

    import horovodlite.lightning  # registers strategy="horovodlite"
    trainer = pytorch_lightning.Trainer(strategy="horovodlite")

Start the script with `horovodlite-run -np 4 python train.py` or `mpiexec -n 4 python train.py`.
"""

from pytorch_lightning.strategies import StrategyRegistry

from .environment import HorovodLiteEnvironment
from .strategy import HorovodLiteStrategy

__all__ = ["HorovodLiteEnvironment", "HorovodLiteStrategy"]

HorovodLiteStrategy.register_strategies(StrategyRegistry)
