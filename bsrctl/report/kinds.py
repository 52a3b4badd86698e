"""Which renderer writes the summary of each kind of run: ``render(doc)`` is summary.md."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from bsrctl.evidence.kinds import KINDS

# kind -> module under bsrctl.report holding `render(doc) -> str` (the evidence registry's)
RENDERERS: dict[str, str] = {name: kind.renderer for name, kind in KINDS.items()}


def renderer(kind: str) -> Callable[[dict[str, Any]], str]:
    module = RENDERERS.get(kind)
    if module is None:
        raise ValueError(f"no renderer for evidence kind {kind!r}; known: {sorted(RENDERERS)}")
    return import_module(f"bsrctl.report.{module}").render  # type: ignore[no-any-return]


def render(doc: dict[str, Any]) -> str:
    """summary.md of one run."""
    return renderer(doc["kind"])(doc)
