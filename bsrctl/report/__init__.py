"""Every rendering of a run, from its evidence.json alone, never from live state.

``render(doc)`` picks the renderer of the run's kind; ``write_summary(run_dir)`` writes
summary.md with it. Runs write their summary.md through this same function, so
``bsrctl report RUN`` reproduces it byte for byte. ``write_report(run_dirs)`` renders one
run or several into report.md and a self-contained report.html with the figures
(``figures``: matplotlib; ``claims``: paper vs measured; ``units``: MiB, ms, provenance).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bsrctl.evidence import load_evidence

if TYPE_CHECKING:
    from bsrctl.report.document import Written

# kind -> module under bsrctl.report holding `render(doc) -> str`
RENDERERS = {
    "ladder": "restore",
    "sweep": "restore",
    "law": "restore",
    "roundtrip": "restore",
    "failmatrix": "failmatrix",
    "tempokv": "tempokv",
    "bench": "bench",
    "soak": "soak",
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


def write_report(run_dirs: Sequence[Path], out_dir: Path | None = None) -> Written:
    """report.md and a self-contained report.html of one run or several (matplotlib)."""
    from bsrctl.report.document import write_report as write

    return write(run_dirs, out_dir)
