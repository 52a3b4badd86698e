"""report.html's timeline figure: the slowest requests' TTFT, phase by phase (their critical
paths from the run's spans.jsonl, coloured by the process that spent the time). A restore
run's figure shows its measured restores only (``bsrctl.trace.restores``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bsrctl.report.figures import Plot, new_fig, svg
from bsrctl.trace.restores import measured_restores
from bsrctl.trace.timeline import slowest, spans_of

COLOURS = {"bsrctl": "#1565c0", "bsrkv.server": "#2e7d32", "lmcache": "#6a1b9a",
           "vllm": "#ef6c00", "": "#bdbdbd"}  # fmt: skip


def timeline_plots(run_dir: Path, doc: dict[str, Any], top: int = 3) -> list[Plot]:
    path = Path(run_dir) / "spans.jsonl"
    if not path.exists():
        return []
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    spans = spans_of(records)
    restores = measured_restores(doc, spans)
    paths = slowest(spans if restores is None else restores, top)
    if not paths:
        return []
    what = "request(s)" if restores is None else "measured restore(s)"
    fig, (ax,) = new_fig(doc, f"Slowest {len(paths)} {what}: where the TTFT went")
    seen: set[str] = set()
    for row, p in enumerate(paths):
        for ph in p.phases:
            x = (ph.start_ns - p.start_ns) / 1e6
            key = ph.service if not ph.gap or ph.service else ""
            label = (ph.service or "untraced") if key not in seen else None
            seen.add(key)
            ax.barh(row, ph.ms, left=x, height=0.6, color=COLOURS.get(key, "#9e9e9e"),
                    alpha=0.55 if ph.gap else 1.0, edgecolor="white", label=label)  # fmt: skip
            if ph.ms >= 0.08 * p.ttft_ms:
                ax.text(x + ph.ms / 2, row, ph.name, ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(paths)), [f"{p.request}\n{p.ttft_ms:.1f} ms" for p in paths])
    ax.invert_yaxis()
    ax.set_xlabel("ms from client send (critical path; faded: time inside a span, untraced)")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    title = "Slowest requests'" if restores is None else "Slowest measured restores'"
    return [Plot("timeline", f"{title} timelines (critical path)", svg(fig))]
