"""bsrctl's commands that read evidence alone (report, runs, compare, verify, schema, export)
and the console helpers every command shares. bsrctl.cli merges these commands into its app;
they live here to keep both modules short, and below cli so that cli imports them, never the
other way round."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup

from bsrctl.errors import BadInput, StackFailed


class HelpGroup(TyperGroup):
    """A group whose command lists read right: typer's rich help keeps a docstring's line
    breaks in a list (a summary broken mid-sentence), so each command's summary there, its
    subgroups' commands' too, is its first paragraph on one line. ``PANELS`` (panel ->
    commands, in order) groups them under typer's ``rich_help_panel`` and lists them panel
    by panel; others come last."""

    PANELS: dict[str, tuple[str, ...]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        panel_of = {name: panel for panel, names in self.PANELS.items() for name in names}
        for name, cmd in self.commands.items():
            if name in panel_of:
                cmd.rich_help_panel = panel_of[name]  # type: ignore[attr-defined]
            for c in [cmd, *getattr(cmd, "commands", {}).values()]:
                if c.help and not c.short_help:
                    c.short_help = " ".join(c.help.split("\n\n")[0].split())

    def list_commands(self, ctx: Any) -> list[str]:
        order = [n for names in self.PANELS.values() for n in names if n in self.commands]
        return order + [n for n in self.commands if n not in order]


evidence_app = typer.Typer()  # merged into bsrctl.cli.app (add_typer without a name)
err = Console(stderr=True)
out = Console()

T = TypeVar("T")

JsonOpt = Annotated[
    bool, typer.Option("--json", help="print only the evidence path and the verdict, as JSON")
]
RunDirs = Annotated[list[Path], typer.Argument(help="reports/<run_id> ...")]


def guarded(fn: Callable[[], T]) -> T:
    """Map bsrctl's errors to exit codes: bad input 2, stack failure 3."""
    try:
        return fn()
    except BadInput as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except StackFailed as exc:
        err.print(f"[red]stack failed:[/red] {exc}", highlight=False, soft_wrap=True)
        if exc.log_tail:
            err.print("--- log tail ---", highlight=False)
            err.print(exc.log_tail, highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(3) from None
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM (experiments turn it into this)
        err.print(f"interrupted ({exc or 'SIGINT'}): the stack was stopped; evidence kept, "
                  f"marked complete=false", highlight=False, soft_wrap=True)  # fmt: skip
        raise typer.Exit(3) from None


@evidence_app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="reports/<run_id> ...")],
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="where report.md/.html go (default: the run's folder)"),
    ] = None,
) -> None:
    """Re-render each run's summary.md from its evidence.json, then report.md and one
    self-contained report.html (figures inline) for the runs; prints their paths."""
    from bsrctl.evidence.manifest import add_to_manifest, write_manifest
    from bsrctl.report import write_report, write_summary
    from bsrctl.report.document import Written

    def go() -> Written:
        for run_dir in run_dirs:
            if not (run_dir / "evidence.json").is_file():
                raise BadInput(f"{run_dir}: no evidence.json; pass a folder under reports/")
        for run_dir in run_dirs:
            write_summary(run_dir)
        written = write_report(run_dirs, out_dir)
        rendered = [written.markdown, written.html, *written.figures]
        folder = written.markdown.parent
        if (folder / "manifest.json").is_file():  # a run's sums stay; the renderings join
            add_to_manifest(folder, rendered)
        else:
            write_manifest(folder)
        return written

    written = guarded(go)
    if written.figures_skipped:
        err.print(f"figures skipped: {written.figures_skipped}", highlight=False)
    out.print(f"report.md: {written.markdown}", highlight=False, soft_wrap=True)
    out.print(f"report.html: {written.html}", highlight=False, soft_wrap=True)


@evidence_app.command()
def runs(
    root: Annotated[Path, typer.Argument(help="a reports folder")] = Path("reports"),
    kind: Annotated[str | None, typer.Option("--kind", help="only runs of this kind")] = None,
    verdict: Annotated[
        str | None, typer.Option("--verdict", help="only PASS, FAIL or UNKNOWN runs")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The runs under a reports folder, newest first: run id, kind, spec, stack, started,
    complete, verdict."""
    from bsrctl.report.runs import list_runs, render

    def go() -> list[Any]:
        if verdict is not None and verdict not in ("PASS", "FAIL", "UNKNOWN"):
            raise BadInput(f"--verdict {verdict!r}: one of PASS, FAIL, UNKNOWN")
        if not root.is_dir():
            raise BadInput(f"{root}: no such folder; pass the --out of your runs")
        return list_runs(root, kind, verdict)

    rows = guarded(go)
    if as_json:
        sys.stdout.write(json.dumps([r.to_json() for r in rows]) + "\n")
    else:
        out.print(render(rows), end="", markup=False, highlight=False, soft_wrap=True)


@evidence_app.command()
def compare(
    base: Annotated[Path, typer.Argument(help="the run to compare against (its folder)")],
    new: Annotated[Path, typer.Argument(help="the run under test (its folder)")],
    fail_on: Annotated[
        list[str] | None,
        typer.Option("--fail-on", help="METRIC:PCT, exit 1 when METRIC worsens by > PCT %"),
    ] = None,
) -> None:
    """Point-by-point deltas of two runs of one spec; exit 1 when a --fail-on metric
    regresses beyond its bound (and significantly, Mann-Whitney α = 0.05, where both runs
    have samples; the noise floor is printed), 2 when the runs differ in kind or spec."""
    from bsrctl.evidence import load_evidence
    from bsrctl.report.compare import Bound, compare, render

    def go() -> Any:
        docs = []
        for run_dir in (base, new):
            if not (run_dir / "evidence.json").is_file():
                raise BadInput(f"{run_dir}: no evidence.json; pass a folder under reports/")
            docs.append(load_evidence(run_dir / "evidence.json"))
        try:
            bounds = [Bound.parse(b) for b in fail_on or []]
            return compare(docs[0], docs[1], bounds)
        except ValueError as exc:  # Incomparable included: refusing is bad input
            raise BadInput(str(exc)) from None

    result = guarded(go)
    out.print(render(result), end="", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(1 if result.regressed else 0)


@evidence_app.command()
def verify(run_dir: Annotated[Path, typer.Argument(help="reports/<run_id>")]) -> None:
    """Recompute the sha256 of every file of a run folder against its manifest.json; name
    each file that changed, appeared or vanished (exit 1), else exit 0."""
    from bsrctl.evidence.manifest import verify as check

    def go() -> Any:
        try:
            return check(run_dir)
        except FileNotFoundError:
            raise BadInput(f"{run_dir}: no manifest.json; pass a run folder") from None

    res = guarded(go)
    for label, names in (("changed", res.changed), ("appeared", res.appeared),
                         ("vanished", res.vanished)):  # fmt: skip
        for name in names:
            out.print(f"{label}: {name}", markup=False, highlight=False)
    if res.ok:
        out.print(f"ok: {res.checked} files match manifest.json", highlight=False)
    raise typer.Exit(0 if res.ok else 1)


@evidence_app.command()
def schema() -> None:
    """The JSON Schema of evidence.json, from the models the writer validates against."""
    from bsrctl.evidence.schema import json_schema_text

    sys.stdout.write(json_schema_text())


@evidence_app.command()
def export(
    run_dirs: RunDirs,
    fmt: Annotated[str, typer.Option("--format", help="csv | parquet | json")] = "csv",
    out_file: Annotated[
        Path | None, typer.Option("--out", help="the file to write (default: stdout)")
    ] = None,
) -> None:
    """The runs' evidence as one table, a row per point and sample (columns:
    docs/evidence-table.md), as csv, parquet or json records, for notebooks and dashboards."""
    from bsrctl.evidence.table import FORMATS, load_frame, write_frame

    def go() -> bytes | None:
        if fmt not in FORMATS:  # before reading anything: a typo never waits on the runs
            raise BadInput(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
        return write_frame(load_frame(run_dirs), fmt, out_file)

    data = guarded(go)
    if data is not None:
        sys.stdout.write(data.decode())
    else:
        err.print(f"{fmt}: {out_file}", highlight=False, soft_wrap=True)
