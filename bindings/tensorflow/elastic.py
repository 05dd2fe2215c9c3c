"""hvd.elastic for TensorFlow: TensorFlowKerasState and TensorFlowState (eager TensorFlow).

Glue on horovodlite.training.elastic. TensorFlowKerasState is Keras 3's KerasState
(horovodlite.keras.elastic), under Horovod's name; TensorFlowState commits a list of
`tf.Variable`s. TF1 sessions are not supported: elastic runs are eager.
"""

from horovodlite.keras.elastic import (
    CommitStateCallback,
    KerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
    VariablesHandler,
)

from horovodlite.training.elastic import *  # noqa: F403 (SHARED: run, State, ...)
from horovodlite.training.elastic import SHARED, HandlerState

from .functions import broadcast_variables

__all__ = [
    *SHARED,
    "TensorFlowKerasState",
    "TensorFlowState",
    "CommitStateCallback",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
]


class TensorFlowKerasState(KerasState):
    """Horovod's TensorFlowKerasState: a Keras model, its optimizer, picklable attributes."""


class TensorFlowState(HandlerState):
    """Horovod's TensorFlowState for eager TensorFlow: a list of variables and attributes.

    `commit()` keeps numpy copies of `variables`, `sync()` broadcasts them from rank 0,
    `restore()` assigns the last commit.

    Raises:
        ValueError: a `session` is given (TF1 graphs are not supported by elastic runs).
    """

    def __init__(self, variables=None, session=None, **kwargs):
        if session is not None:
            raise ValueError(
                "TensorFlowState(session=...): elastic runs support eager TensorFlow only; "
                "pass the variables and run eagerly"
            )
        variables = list(variables or [])

        def handler_for(value):
            if value is variables:
                return VariablesHandler(variables, list, broadcast_variables)
            return None

        super().__init__(handler_for, variables=variables, **kwargs)
