"""Every rendering of a run, from its evidence.json alone, never from live state.

``render(doc)`` picks the renderer of the run's kind (``kinds``); ``write_summary(run_dir)`` writes
summary.md with it. Runs write their summary.md through this same function, so
``bsrctl report RUN`` reproduces it byte for byte. ``write_report(run_dirs)`` renders one
run or several into report.md and a self-contained report.html with the figures
(``figures``: matplotlib; ``claims``: paper vs measured; ``units``: MiB, ms, provenance).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bsrctl.evidence import load_evidence
from bsrctl.report.kinds import RENDERERS, render, renderer

__all__ = ["RENDERERS", "render", "renderer", "write_report", "write_summary"]

if TYPE_CHECKING:
    from bsrctl.report.document import Written


def write_summary(run_dir: Path) -> Path:
    out = Path(run_dir) / "summary.md"
    out.write_text(render(load_evidence(Path(run_dir) / "evidence.json")))
    return out


def write_report(run_dirs: Sequence[Path], out_dir: Path | None = None) -> Written:
    """report.md and a self-contained report.html of one run or several (matplotlib)."""
    from bsrctl.report.document import write_report as write

    return write(run_dirs, out_dir)
