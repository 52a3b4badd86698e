"""Which renderer writes the summary of each kind of run: ``render(doc)`` is summary.md."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any

from bsrctl.evidence.kinds import KINDS

# kind -> module holding `render(doc) -> str` (the evidence registry's): a bare name is under
# bsrctl.report, a dotted one a full module path. Imported by name when asked, so the report
# package imports no mechanism's report (the top-level layers keep tempokv above report).
RENDERERS: dict[str, str] = {name: kind.renderer for name, kind in KINDS.items()}


def renderer(kind: str) -> Callable[[dict[str, Any]], str]:
    module = RENDERERS.get(kind)
    if module is None:
        raise ValueError(f"no renderer for evidence kind {kind!r}; known: {sorted(RENDERERS)}")
    path = module if "." in module else f"bsrctl.report.{module}"
    return import_module(path).render  # type: ignore[no-any-return]


def render(doc: dict[str, Any]) -> str:
    """summary.md of one run."""
    return renderer(doc["kind"])(doc)
