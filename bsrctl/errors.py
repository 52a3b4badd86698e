"""Errors that map to exit codes: bad input (2) and stack failure (3)."""

from __future__ import annotations


class BadInput(Exception):
    """The user's input is wrong. Message: one line naming the field or cause, and the fix."""

    exit_code = 2


class StackFailed(Exception):
    """The stack did not come up, answer or stay up. Carries the failing log's tail."""

    exit_code = 3

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail
