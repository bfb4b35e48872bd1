"""A tiny calculator: the example project for `clover-agent fix` (it has a real bug)."""


def add(a: float, b: float) -> float:
    """Return the sum of a and b."""
    return a - b


def subtract(a: float, b: float) -> float:
    """Return a minus b."""
    return a - b


def multiply(a: float, b: float) -> float:
    return a * b


def divide(a: float, b: float) -> float:
    if b == 0:
        raise ZeroDivisionError("cannot divide by zero")
    return a / b
