"""What a serving point reports of the install read-back (``measures.readback``), summed
over the point's BSR restore outcomes (one per rank).

The scratch a read-back holds is outside L1 and outside the restore pool's gauge (one chunk
per object group per rank, ``bsrkv.lmcache_ext.bsr.readback``): it is not inside ``aux`` of
the bound ``W·c + aux`` and is stated beside it, as ``scratch_bytes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bsrkv.lmcache_ext.bsr.protocol import RestoreOutcomeSummary

SCRATCH_NOTE = "outside L1 and the restore-pool gauge: not in W*c + aux, stated beside it"


def readback_measures(
    outcomes: Sequence[RestoreOutcomeSummary], enabled: bool | None
) -> dict[str, Any]:
    """Totals of the point's read-backs, with the install time of the same windows beside
    them (the cost: read-back seconds per window against install + sync seconds)."""
    bsr = [o for o in outcomes if o.mode == "bsr"]
    rbs = [o.readback for o in bsr if o.readback is not None]
    windows = sum(r.windows_checked for r in rbs)
    seconds = sum(r.seconds for r in rbs)
    phases = [p for o in bsr for p in (o.window_phases or ())]
    install_s = sum(p.get("install_s", 0.0) + p.get("sync_s", 0.0) for p in phases)
    return {
        "enabled": enabled,
        "path": "bsr windows" if bsr else "stock whole-plan retrieve: not read back",
        "windows_checked": windows,
        "chunks_checked": sum(r.chunks_checked for r in rbs),
        "chunks_unchecked": sum(r.chunks_unchecked for r in rbs),
        "mismatches": sum(r.mismatches for r in rbs),
        "seconds": round(seconds, 6),
        "seconds_per_window": round(seconds / windows, 6) if windows else None,
        "install_seconds": round(install_s, 6),
        "install_seconds_per_window": round(install_s / len(phases), 6) if phases else None,
        "scratch_bytes": max((r.scratch_bytes for r in rbs), default=0),
        "scratch_in_aux": False,
        "scratch_note": SCRATCH_NOTE,
    }
