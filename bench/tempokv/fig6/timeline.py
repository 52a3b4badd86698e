"""The timeline figure of one rate per arm (``where.Row``s): a row per request at its arrival,
grey until its retrieve starts (with the part its lookup was held for committed staging in
orange, ending where the retrieve starts), the retrieve in red (on LMCache-DAX: faults from
flash), then blue to its first token. An SVG beside the bench's run folder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from bsrctl.report.figures import svg
from fig6.where import Row

PHASES = (("waiting", "#bdbdbd"), ("held for staging", "#ef6c00"), ("retrieve", "#c62828"),
          ("to first token", "#1565c0"))  # fmt: skip


def draw(rows: Mapping[str, Sequence[Row]], rate: float, path: Path) -> Path:
    from matplotlib.figure import Figure

    arms = list(rows)
    fig = Figure(figsize=(6.5 * len(arms), 4.8))
    axes = fig.subplots(1, len(arms), squeeze=False, sharex=True)[0]
    fig.suptitle(
        f"Figure 6 @ {rate:g} rps: each request's retrieval after its arrival", fontsize=11
    )
    colours = dict(PHASES)
    for ax, arm in zip(axes, arms, strict=True):
        for i, r in enumerate(rows[arm]):
            start = r.retrieve_start_s if r.retrieve_start_s is not None else 0.0
            end = start + r.retrieve_s
            ttft = r.ttft_s if r.ttft_s is not None else end
            a = r.arrival_s
            ax.barh(i, start, left=a, color=colours["waiting"], height=0.7)
            if r.hold_s:
                ax.barh(i, r.hold_s, left=a + start - r.hold_s, color=colours["held for staging"],
                        height=0.7)  # fmt: skip
            ax.barh(i, r.retrieve_s, left=a + start, color=colours["retrieve"], height=0.7)
            ax.barh(i, max(0.0, ttft - end), left=a + end, color=colours["to first token"],
                    height=0.7)  # fmt: skip
        ax.set_title(arm, fontsize=10)
        ax.set_xlabel("seconds from the cell's first arrival")
        ax.set_ylabel("request (arrival order)")
        ax.invert_yaxis()
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=n) for n, c in PHASES]
    fig.legend(handles=handles, loc="lower center", ncol=len(PHASES), fontsize=8)
    fig.subplots_adjust(bottom=0.2, top=0.88, wspace=0.2)
    path.write_text(svg(fig))
    return path
