"""`bsrctl report RUN_DIR…`: one run or several into report.md (figures beside it as SVG
files) and one self-contained report.html (the same text, every figure inline as SVG, the
style inline: it opens with no network and no other file).

The text of each run is its summary.md (``render``), headings shifted under the report's
own, with the run's figures after its "At a glance".
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsrctl.evidence import load_evidence
from bsrctl.evidence.verdict import EXCEEDS
from bsrctl.report.figures import Plot, available, plots
from bsrctl.report.kinds import render
from bsrctl.report.timeline_figure import timeline_plots

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1b1b1b; margin: 0; background: #fafafa; }
main { max-width: 1100px; margin: 0 auto; padding: 1.5em 2em 4em; background: #fff; }
h1 { font-size: 1.6em; border-bottom: 2px solid #333; padding-bottom: .2em; }
h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: .6em 0; font-size: 12.5px; }
th, td { border: 1px solid #d0d0d0; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
code { background: #f3f3f3; padding: 0 3px; border-radius: 3px; }
figure { margin: 1em 0 1.6em; }
figure svg { max-width: 100%; height: auto; border: 1px solid #e3e3e3; }
figcaption { font-size: 12px; color: #555; }
td.PASS { color: #2e7d32; font-weight: 600; } td.FAIL { color: #c62828; font-weight: 600; }
td.UNKNOWN { color: #b07d00; font-weight: 600; } td.EXCEEDS { color: #1565c0; font-weight: 600; }
"""


@dataclass(frozen=True)
class Written:
    markdown: Path
    html: Path
    figures: tuple[Path, ...]
    figures_skipped: str = ""  # why there are no figures (matplotlib missing), else ""


def default_out(run_dirs: Sequence[Path]) -> Path:
    """One run: its own folder. Several: a folder beside the first, named for the set."""
    if len(run_dirs) == 1:
        return Path(run_dirs[0])
    names = "\n".join(sorted(Path(d).name for d in run_dirs))
    return Path(run_dirs[0]).parent / f"report-{hashlib.sha256(names.encode()).hexdigest()[:10]}"


def _shift(markdown: str, levels: int) -> list[str]:
    pad = "#" * levels
    return [pad + line if line.startswith("#") else line for line in markdown.split("\n")]


def _with_figures(lines: list[str], figs: list[str]) -> list[str]:
    """Insert the figure lines before the second section heading (after "At a glance")."""
    heads = [i for i, line in enumerate(lines) if line.startswith("### ")]
    at = heads[1] if len(heads) > 1 else len(lines)
    return [*lines[:at], *figs, *lines[at:]]


def _markdown(docs: list[dict[str, Any]], figures: dict[str, list[tuple[Plot, str]]]) -> str:
    lines = [f"# bsrctl report: {len(docs)} run{'s' if len(docs) != 1 else ''}", ""]
    lines += ["| run | kind | stack | complete | verdict |", "|---|---|---|---|---|"]
    lines += [
        f"| {d['run_id']} | {d['kind']} | {(d.get('stack') or {}).get('kind')} | "
        f"{d['complete']} | {d['verdict']} |"
        for d in docs
    ]
    for doc in docs:
        figs = []
        for plot, rel in figures[doc["run_id"]]:
            figs += [f"![{plot.title}]({rel})", ""]
        lines += ["", *_with_figures(_shift(render(doc), 1), figs)]
    return "\n".join(lines).rstrip("\n") + "\n"


def html_page(
    text: str, docs: list[dict[str, Any]], figures: dict[str, list[tuple[Plot, str]]]
) -> str:
    from markdown_it import MarkdownIt

    inline = {rel: plot for fl in figures.values() for plot, rel in fl}
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    for rel, plot in inline.items():
        tag = f'<p><img src="{html.escape(rel)}" alt="{html.escape(plot.title)}" /></p>'
        fig = f"<figure>{plot.svg}<figcaption>{html.escape(plot.title)}</figcaption></figure>"
        body = body.replace(tag, fig)
    for verdict in ("PASS", "FAIL", "UNKNOWN", EXCEEDS):
        body = body.replace(f"<td>{verdict}</td>", f'<td class="{verdict}">{verdict}</td>')
    title = ", ".join(d["run_id"] for d in docs)
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>bsrctl report: {html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
        f"<body>\n<main>\n{body}</main>\n</body>\n</html>\n"
    )


def write_report(run_dirs: Sequence[Path], out_dir: Path | None = None) -> Written:
    """Render the runs into out_dir (default: ``default_out``); byte-stable for the same
    evidence."""
    docs = [load_evidence(Path(d) / "evidence.json") for d in run_dirs]
    out = Path(out_dir) if out_dir is not None else default_out(run_dirs)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    figures: dict[str, list[tuple[Plot, str]]] = {}
    paths: list[Path] = []
    skipped = "" if available() else "matplotlib is not installed: pip install matplotlib"
    for doc, run_dir in zip(docs, run_dirs, strict=True):
        figures[doc["run_id"]] = []
        for plot in [] if skipped else [*plots(doc), *timeline_plots(Path(run_dir), doc)]:
            rel = f"figures/{doc['run_id']}-{plot.name}.svg"
            (out / rel).write_text(plot.svg)
            paths.append(out / rel)
            figures[doc["run_id"]].append((plot, rel))
    text = _markdown(docs, figures)
    md, page = out / "report.md", out / "report.html"
    md.write_text(text)
    page.write_text(html_page(text, docs, figures))
    return Written(md, page, tuple(paths), skipped)
