"""The one error type users see from the launcher: says what is wrong and what to change."""


class SpecError(ValueError):
    """Invalid user input, raised before anything is created, started or paid for."""
