"""Exception types raised by horovodlite."""

__all__ = ["HorovodLiteError", "HorovodInternalError", "NotInitializedError", "MismatchError"]


class HorovodLiteError(RuntimeError):
    """A collective failed, or ranks disagreed about one."""


# Horovod's name for the same thing; scripts that catch it keep working.
HorovodInternalError = HorovodLiteError


class NotInitializedError(HorovodLiteError):
    """horovodlite was used before init() or after shutdown()."""

    def __init__(self, what: str = "horovodlite"):
        super().__init__(f"{what} is not initialized: call hvd.init() first")


class MismatchError(HorovodLiteError):
    """Ranks submitted a collective with different metadata, or one rank's arguments were bad."""
