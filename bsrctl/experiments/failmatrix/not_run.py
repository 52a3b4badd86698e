"""The points of failure cells that could not run as specified: one UNKNOWN check naming
why, never PASS (an attached deployment lacking an operator command, a setup that did not
reach its seeded state)."""

from __future__ import annotations

import time
from typing import Any

from bsrctl.evidence import Point
from bsrctl.evidence.verdict import check
from bsrctl.experiments.failmatrix.spec import FIELD_REPORTS, CellSpec, FailMatrixSpec


def unknown_point(
    spec: FailMatrixSpec, cell: CellSpec, t_cell: float, name: str, why: str, **extra: Any
) -> Point:
    """A cell that could not run as specified: one UNKNOWN check ``name``, never PASS."""
    wl = spec.workload
    return Point(
        id=cell.id,
        params=cell.model_dump(),
        measures={
            "covers": FIELD_REPORTS.get(cell.fault, ""),
            "tokens": wl.prompt_tokens,
            "window_chunks": wl.window_chunks,
            "cached_tokens": None,
            "expected_cached_tokens": None,
            "time_to_fallback_s": None,
            "cell_s": round(time.monotonic() - t_cell, 3),
            **extra,
        },
        checks=(check(name, None, why),),
    )


def unseeded_point(
    spec: FailMatrixSpec,
    cell: CellSpec,
    t_cell: float,
    seed: dict[str, Any],
    flood: list[dict[str, Any]],
    reason: str,
) -> Point:
    """A cell whose setup could not reach the seeded state: UNKNOWN, never PASS."""
    extra = {"seed": seed, **({"flood_seeds": flood} if flood else {})}
    return unknown_point(spec, cell, t_cell, "setup_seeded", reason, **extra)
