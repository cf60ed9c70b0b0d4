"""The one error type users see from the launcher: says what is wrong and what to change."""

from training.common.failure import SpecError

__all__ = ["JobFailed", "SpecError"]


class JobFailed(Exception):
    """A job that started and failed (or was stopped): its exit code and, in one line, why."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
