"""The core's own error: a restore configured wrongly (W, B, a timeout).

A ``ValueError``, so the core needs nothing of the CLI; callers at the edge map it to
their own bad-input error.
"""

from __future__ import annotations


class RestoreConfigError(ValueError):
    """A restore knob is out of range. Message: the field, its value and the fix."""
