"""The fleet report as report.md (figures beside it as SVG files) and one self-contained
report.html (the figures inline), rendered as ``bsrctl report`` renders a run: the same
figure code (``bsrctl.report.figures``) and page (``bsrctl.report.document``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsrctl.fleet.report import CUTOFF, FleetReport, Spread
from bsrctl.report.compare import fmt, regression_line
from bsrctl.report.document import html_page
from bsrctl.report.figures import Plot, available, svg

RULE = (
    f"robust z = 0.6745 (x − median) / MAD across nodes, outlier where |z| > {CUTOFF} "
    "(Iglewicz–Hoaglin; where MAD is 0, (x − median) / (1.253314 · mean absolute deviation))"
)


@dataclass(frozen=True)
class FleetWritten:
    markdown: Path
    html: Path
    figures: tuple[Path, ...]


def outlier_lines(fr: FleetReport) -> list[str]:
    return [
        f"- OUTLIER {o.node}: {o.metric} at {o.point} ({o.kind}): {fmt(o.metric, o.value)}, "
        f"fleet median {fmt(o.metric, o.median)}, z = {o.score:+.1f}"
        for o in fr.outliers
    ]


def baseline_lines(fr: FleetReport) -> list[str]:
    lines = []
    for b in fr.baselines:
        where = f"{b.node} {b.kind}"
        if b.comparison is None:
            lines.append(f"- {where}: {b.note}")
            continue
        c = b.comparison
        found = [regression_line(d, bound) for d, bound in c.regressions]
        head = f"- {where}: {c.new_id} against {c.base_id}: "
        lines.append(head + ("; ".join(found) if found else "no regression beyond a bound"))
    return lines


def _spread_row(s: Spread) -> str:
    x = [v for _, v in s.values]
    named = ", ".join(o.node for o in s.outliers) or "–"
    mad = fmt(s.metric, s.mad) if s.mad else "0"
    return (
        f"| {s.point} | {fmt(s.metric, s.median)} | {mad} | {fmt(s.metric, min(x))} | "
        f"{fmt(s.metric, max(x))} | {len(x)} | {named} |"
    )


def _groups(fr: FleetReport) -> dict[tuple[str, str], list[Spread]]:
    out: dict[tuple[str, str], list[Spread]] = {}
    for s in fr.spreads:
        out.setdefault((s.kind, s.metric), []).append(s)
    return out


def markdown(fr: FleetReport, figures: dict[tuple[str, str], str]) -> str:
    shas = sorted({r.doc["spec_sha256"][:12] for r in fr.runs}) or ["–"]
    kinds = fr.kinds or ["run"]
    lines = [f"# bsrctl fleet report: {len(fr.nodes)} nodes, {'PASS' if fr.passed else 'FAIL'}"]
    lines += ["", f"Spec sha256 `{shas[0]}`; outliers: {RULE}.", "", "## Verdicts", ""]
    lines += ["| node | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    lines += [f"| {n} | " + " | ".join(fr.grid[n][k] for k in kinds) + " |" for n in fr.nodes]
    lines += ["", "## Outliers", ""]
    lines += outlier_lines(fr) or [f"none: every node within |z| ≤ {CUTOFF} on every key metric"]
    lines += ["", "## Distributions across nodes"]
    for (kind, metric), rows in _groups(fr).items():
        lines += ["", f"### {kind}: {metric}", ""]
        lines += ["| point | median | MAD | min | max | nodes | outliers |", "|---" * 7 + "|"]
        lines += [_spread_row(s) for s in rows]
        if (kind, metric) in figures:
            lines += ["", f"![{kind}: {metric} across nodes]({figures[(kind, metric)]})"]
    if fr.baselines:
        lines += ["", "## Against each node's previous run", "", *baseline_lines(fr)]
    return "\n".join(lines) + "\n"


def spread_plot(kind: str, metric: str, rows: list[Spread], nodes: tuple[str, ...]) -> Plot:
    """Each point's value per node (a column of dots per point), outliers red and named."""
    from matplotlib.figure import Figure

    title = f"{kind}: {metric} across nodes"
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.subplots()
    fig.suptitle(title, fontsize=11)
    scale, unit = (1000.0, "ms") if metric.endswith("_s") else (
        (1 / 2**20, "MiB") if "bytes" in metric else (1.0, ""))  # fmt: skip
    width = 0.6 / max(len(nodes), 1)
    for i, s in enumerate(rows):
        odd = {o.node for o in s.outliers}
        for node, v in s.values:
            x = i - 0.3 + width * (nodes.index(node) + 0.5)
            ax.plot(x, v * scale, "o", color="#c62828" if node in odd else "#1565c0", ms=5)
            if node in odd:
                ax.annotate(node, (x, v * scale), textcoords="offset points", xytext=(4, 4),
                            fontsize=8, color="#c62828")  # fmt: skip
        ax.hlines(s.median * scale, i - 0.35, i + 0.35, colors="#555555", lw=1)
    ax.set_xticks(range(len(rows)), [s.point for s in rows], rotation=30, fontsize=8)
    ax.set(ylabel=f"{metric} ({unit})" if unit else metric)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.subplots_adjust(bottom=0.2)
    return Plot(f"fleet-{kind}-{metric}", title, svg(fig))


def write(fr: FleetReport, out: Path) -> FleetWritten:
    """report.md, report.html and one SVG per varying metric, into ``out`` (files only: a
    node folder beside them stays the only folder, so ``fleet report DIR/*/`` still works)."""
    out.mkdir(parents=True, exist_ok=True)
    plots: list[tuple[Plot, str]] = []
    rels: dict[tuple[str, str], str] = {}
    for (kind, metric), rows in _groups(fr).items() if available() else ():
        if all(s.mad == 0 and len({v for _, v in s.values}) == 1 for s in rows):
            continue  # one value everywhere: the table says it
        plot = spread_plot(kind, metric, rows, fr.nodes)
        rel = f"{plot.name}.svg"
        (out / rel).write_text(plot.svg)
        plots.append((plot, rel))
        rels[(kind, metric)] = rel
    text = markdown(fr, rels)
    md, page = out / "report.md", out / "report.html"
    md.write_text(text)
    docs: list[dict[str, Any]] = [r.doc for r in fr.runs]
    page.write_text(html_page(text, docs, {"fleet": plots}))
    return FleetWritten(md, page, tuple(out / rel for _, rel in plots))
