"""The launcher's own error type."""

__all__ = ["LaunchError"]


class LaunchError(RuntimeError):
    """The job cannot start: a missing launcher, an unreachable host, a failed cluster setup."""
