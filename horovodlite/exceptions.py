"""Exception types raised by horovodlite."""

__all__ = [
    "HorovodLiteError",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "NotInitializedError",
    "MismatchError",
]


class HorovodLiteError(RuntimeError):
    """A collective failed, or ranks disagreed about one."""


# Horovod's name for the same thing; scripts that catch it keep working.
HorovodInternalError = HorovodLiteError


class HostsUpdatedInterrupt(RuntimeError):
    """The elastic launcher found new hosts: every rank leaves at this commit to restart larger.

    Not a `HorovodLiteError`, so code that catches collective failures does not swallow it.
    `skip_sync` is Horovod's field; a restarted job always syncs.
    """

    def __init__(self, skip_sync: bool = False):
        super().__init__("the elastic job's hosts changed: restart at the new size")
        self.skip_sync = skip_sync


class NotInitializedError(HorovodLiteError):
    """horovodlite was used before init() or after shutdown()."""

    def __init__(self, what: str = "horovodlite"):
        super().__init__(f"{what} is not initialized: call hvd.init() first")


class MismatchError(HorovodLiteError):
    """Ranks submitted a collective with different metadata, or one rank's arguments were bad."""
