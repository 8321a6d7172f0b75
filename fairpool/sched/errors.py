"""Errors for bad parameters: every message starts with the parameter it is about."""

from __future__ import annotations

import math


class ConfigError(ValueError):
    """A parameter has a value fairpool cannot use; `parameter` names it."""

    def __init__(self, parameter: str, problem: str) -> None:
        self.parameter = parameter
        self.problem = problem
        super().__init__(f"{parameter}: {problem}")


def require_number(parameter: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(parameter, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(parameter, f"must be finite, got {value!r}")
    return float(value)


def require_positive(parameter: str, value: object) -> float:
    number = require_number(parameter, value)
    if number <= 0:
        raise ConfigError(parameter, f"must be > 0, got {value!r}")
    return number


def require_non_negative(parameter: str, value: object) -> float:
    number = require_number(parameter, value)
    if number < 0:
        raise ConfigError(parameter, f"must be >= 0, got {value!r}")
    return number


def require_count(parameter: str, value: object, minimum: int = 0) -> int:
    """An integer count such as a token length; `minimum` is inclusive."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(parameter, f"must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(parameter, f"must be >= {minimum}, got {value!r}")
    return value
