"""The ``fleet`` commands (render, run, report, matrix), registered by ``bsrctl.cli``: many
nodes qualified with one spec (bsrctl.fleet)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

err, out = Console(stderr=True), Console()
fleet_app = typer.Typer(no_args_is_help=True, help="Qualify a fleet: one run per node, one report.")

SpecArg = Annotated[Path, typer.Argument(help="YAML spec")]
NodesOpt = Annotated[Path, typer.Option("--nodes", help="NODES.yaml (ladders/*nodes.yaml)")]
FailOn = Annotated[
    list[str] | None,
    typer.Option("--fail-on", help="METRIC:PCT against each node's previous run (compare)"),
]


def _print_report(written: Any, fr: Any) -> None:
    from bsrctl.fleet.document import baseline_lines, outlier_lines

    for node in fr.nodes:
        cells = "  ".join(f"{k} {v}" for k, v in fr.grid[node].items())
        out.print(f"{node}: {cells}", markup=False, highlight=False)
    for line in outlier_lines(fr) + [b for b in baseline_lines(fr) if "REGRESSION" in b]:
        out.print(line[2:], markup=False, highlight=False, soft_wrap=True)
    out.print(f"report.md: {written.markdown}", highlight=False, soft_wrap=True)
    out.print(f"report.html: {written.html}", highlight=False, soft_wrap=True)
    out.print(f"fleet: {'PASS' if fr.passed else 'FAIL'}", highlight=False)


def _report(folders: list[Path], out_dir: Path, baseline: Path | None, fail_on: list[str],
            nodes: Path | None) -> Any:  # fmt: skip
    from bsrctl.errors import BadInput
    from bsrctl.fleet.document import write
    from bsrctl.fleet.nodes import load_nodes
    from bsrctl.fleet.report import fleet_report
    from bsrctl.report.compare import Bound

    try:
        bounds = [Bound.parse(b) for b in fail_on]
        expected = [n.name for n in load_nodes(nodes).nodes] if nodes else []
        fr = fleet_report(folders, baseline, bounds, expected)
    except ValueError as exc:  # Incomparable included: refusing is bad input
        raise BadInput(str(exc)) from None
    return write(fr, out_dir), fr


def register(app: typer.Typer, guarded: Callable[[Callable[[], Any]], Any]) -> None:
    app.add_typer(fleet_app, name="fleet")

    @fleet_app.command("render")
    def render_cmd(
        spec: SpecArg,
        nodes: NodesOpt,
        out_dir: Annotated[Path, typer.Option("--out", help="where the manifests go")],
        run_id: Annotated[str | None, typer.Option("--run-id", help="default: fl-<hex>")] = None,
        stack: Annotated[str | None, typer.Option("--stack", help="default: stack.kind")] = None,
    ) -> None:
        """Kubernetes manifests: a ConfigMap with the spec and one Job per node (pinned, GPUs
        = the spec's TP, results to the nodes file's PVC or host path, least privileges)."""
        from bsrctl.fleet.manifests import render
        from bsrctl.fleet.nodes import load_nodes

        written = guarded(lambda: render(spec, load_nodes(nodes), out_dir, run_id, stack))
        for path in written:
            out.print(str(path), highlight=False, soft_wrap=True)

    @fleet_app.command("matrix")
    def matrix_cmd(nodes: Annotated[Path, typer.Argument(help="NODES.yaml")]) -> None:
        """The nightly's strategy.matrix as one line of JSON: per node its runner labels,
        spec and command."""
        from bsrctl.fleet.manifests import matrix
        from bsrctl.fleet.nodes import load_nodes

        sys.stdout.write(json.dumps(guarded(lambda: matrix(load_nodes(nodes)))) + "\n")

    @fleet_app.command("run")
    def run_cmd(
        spec: SpecArg,
        local: Annotated[int, typer.Option("--local", help="N local nodes (processes)")],
        out_dir: Annotated[Path, typer.Option("--out", help="DIR/node-I/ per node")],
        stack: Annotated[str, typer.Option("--stack", help="storage (the only local one)")] = (
            "storage"
        ),
        command: Annotated[str, typer.Option("--command", help="sweep | law | ladder")] = "sweep",
        node_faults: Annotated[
            list[str] | None,
            typer.Option("--node-faults", help="I:RULES.json: fault rules on node I's FS tier"),
        ] = None,
    ) -> None:
        """A local stand-in for a cluster: N storage-stack nodes as separate processes, each
        with its own folder and storage root, merged by the fleet report (exit 0 all PASS)."""
        from bsrctl.errors import BadInput
        from bsrctl.fleet.local import run_local

        def go() -> Any:
            if stack != "storage":
                raise BadInput(f"--stack {stack!r}: a local fleet runs the storage stack only")
            if command not in ("sweep", "law", "ladder"):
                raise BadInput(f"--command {command!r}: one of sweep, law, ladder")
            faults = {}
            for item in node_faults or []:
                index, sep, path = item.partition(":")
                if not sep or not index.isdigit():
                    raise BadInput(f"--node-faults {item!r}: write I:RULES.json, e.g. 2:delay.json")
                faults[int(index)] = Path(path)
            nodes = run_local(spec, local, out_dir, command, faults)
            for n in nodes:
                if n.returncode not in (0, 1):
                    err.print(f"{n.name}: exit {n.returncode}, see {n.folder / 'bsrctl.log'}")
            return _report([n.folder for n in nodes], out_dir, None, [], None)

        written, fr = guarded(go)
        _print_report(written, fr)
        raise typer.Exit(0 if fr.passed else 1)

    @fleet_app.command("report")
    def report_cmd(
        folders: Annotated[list[Path], typer.Argument(help="node folders (or run folders)")],
        out_dir: Annotated[
            Path | None, typer.Option("--out", help="default: the first folder's parent")
        ] = None,
        baseline: Annotated[
            Path | None, typer.Option("--baseline", help="the previous runs, a folder per node")
        ] = None,
        fail_on: FailOn = None,
        nodes: Annotated[
            Path | None, typer.Option("--nodes", help="NODES.yaml: a node without a run fails")
        ] = None,
    ) -> None:
        """Runs of one spec from many nodes: a node x experiment verdict grid, each key
        metric's spread across nodes with outliers named (robust z, median and MAD, |z| >
        3.5), each node against its previous run; report.md and report.html. Exit 1 on any
        non-PASS or missing node or a regression, 2 on runs of different specs."""
        where = out_dir or Path(folders[0]).resolve().parent
        written, fr = guarded(lambda: _report(folders, where, baseline, fail_on or [], nodes))
        _print_report(written, fr)
        raise typer.Exit(0 if fr.passed else 1)
