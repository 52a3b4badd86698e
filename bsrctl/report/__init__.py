"""Every rendering of a run, from its evidence.json alone, never from live state.

``render(doc)`` picks the renderer of the run's kind; ``write_summary(run_dir)`` writes
summary.md with it. Runs write their summary.md through this same function, so
``bsrctl report RUN`` reproduces it byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

from bsrctl.evidence import load_evidence

# kind -> module under bsrctl.report holding `render(doc) -> str`
RENDERERS = {
    "ladder": "restore",
    "sweep": "restore",
    "law": "restore",
    "roundtrip": "restore",
    "failmatrix": "failmatrix",
    "tempokv": "tempokv",
}


def renderer(kind: str) -> Callable[[dict[str, Any]], str]:
    module = RENDERERS.get(kind)
    if module is None:
        raise ValueError(f"no renderer for evidence kind {kind!r}; known: {sorted(RENDERERS)}")
    return import_module(f"bsrctl.report.{module}").render  # type: ignore[no-any-return]


def render(doc: dict[str, Any]) -> str:
    """summary.md of one run."""
    return renderer(doc["kind"])(doc)


def write_summary(run_dir: Path) -> Path:
    out = Path(run_dir) / "summary.md"
    out.write_text(render(load_evidence(Path(run_dir) / "evidence.json")))
    return out
