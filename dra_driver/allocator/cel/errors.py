"""Errors of compiling and evaluating DRA CEL selectors."""

from __future__ import annotations

# --------------------------------------------------------------------------- errors


class CelError(Exception):
    """A selector expression could not be used; carries the expression text."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(message)
        self.expression = expression
        self.message = message

    def __str__(self) -> str:
        return self.message


class CelCompileError(CelError):
    """The expression does not compile in the DRA environment."""


class CelCostError(CelCompileError):
    """The expression's (estimated or observed) cost exceeds the limit."""


class CelRuntimeError(CelError):
    """Evaluation failed or returned a non-bool; never treated as ``false``."""
