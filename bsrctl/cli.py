"""bsrctl's command line: parse, load the spec, call, render, exit code. Nothing else."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Annotated, Any

import typer
from typer._click.exceptions import ClickException  # typer 0.29 vendors click

from bsrctl import cli_fleet, cli_timeline, unexpected
from bsrctl.cli_evidence import HelpGroup, JsonOpt, err, evidence_app, guarded, out
from bsrctl.evidence import Verdict, exit_code


class GuardedGroup(HelpGroup):
    """Any command's unexpected exception: exit 3, one line (``bsrctl.unexpected``). Its
    help lists the commands by panel, the main jobs first: the experiments that qualify a
    stack (the paper's sweep, ladder, law and failure matrix before the others), then what
    reads their evidence, then the stack itself, then fleets."""

    PANELS = {
        "Experiments": ("sweep", "ladder", "law", "failmatrix", "roundtrip", "soak", "tempokv"),
        "Evidence": ("report", "runs", "compare", "verify", "export", "timeline", "schema"),
        "Stack": ("stack", "doctor"),
        "Fleet": ("fleet",),
    }

    def invoke(self, ctx: typer.Context) -> Any:
        command = unexpected.begin(ctx)
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, ClickException):  # exits, usage errors
            raise
        except Exception as exc:
            err.print(unexpected.report(exc, command), markup=False, soft_wrap=True)
            raise typer.Exit(3) from None


app = typer.Typer(
    cls=GuardedGroup,  # an unexpected exception: exit 3, one line, traceback in the log
    add_completion=False,
    no_args_is_help=True,
    help="Qualify KV-cache restoration (BSR, TempoKV) on vLLM + LMCache + Mooncake.",
)
stack_app = typer.Typer(no_args_is_help=True, help="Start, inspect and stop a serving stack.")
app.add_typer(stack_app, name="stack")
app.add_typer(evidence_app)  # report, runs, compare, verify, schema, export (cli_evidence)

OutOpt = Annotated[Path, typer.Option("--out", help="runs land in OUT/<run_id>/")]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", help="only one line per point and the verdict (CI logs)")
]
SpecArg = Annotated[Path, typer.Argument(help="YAML spec")]
StackOpt = Annotated[
    str | None,
    typer.Option(
        "--stack",
        help="serving | storage | attach | sim: this run's stack (default: the spec's stack.kind)",
    ),
]


@app.callback()
def _every_command() -> None:
    """Library loggers (LMCache, vLLM, Mooncake) never reach the console: they are routed
    before any command imports them, into the run folder while a run is on."""
    from bsrctl import liblogs

    liblogs.capture()


def finish(verdict: Verdict, out_dir: Path, as_json: bool = False) -> None:
    from bsrctl.experiments import console

    last = console.last_run()  # the run this command just ended
    if as_json:
        evidence = str(last[1].resolve()) if last else None
        sys.stdout.write(json.dumps({"evidence": evidence, "verdict": str(verdict)}) + "\n")
    else:
        colour = {"PASS": "green", "FAIL": "red", "UNKNOWN": "yellow"}[str(verdict)]
        where = last[1].parent if last else out_dir
        out.print(
            f"verdict: [{colour}]{verdict}[/{colour}]  ({where})", highlight=False, soft_wrap=True
        )
    raise typer.Exit(exit_code(verdict))


def reclaim_dead_runs(say: bool = True) -> None:
    """Remove the /dev/shm segments that runs killed before their teardown named (and only
    those whose processes are gone and that nothing maps)."""
    from bsrctl.stack.launch.shm_ledger import reclaim

    gone = reclaim()
    if gone and say:
        mib = sum(r.bytes for r in gone) / 2**20
        names = ", ".join(r.name for r in gone)
        err.print(f"reclaimed {len(gone)} /dev/shm segment(s), {mib:.1f} MiB, left by dead "
                  f"runs: {names}", highlight=False, soft_wrap=True)  # fmt: skip


def run_experiment(
    quiet: bool, out_dir: Path, run: Callable[[], Verdict], as_json: bool = False
) -> None:
    """The body every experiment command shares: the console mode, dead runs' /dev/shm
    reclaimed, the run guarded, exit by verdict. `run` does its own import so that
    vLLM/LMCache load only for the command that needs them."""
    from bsrctl.experiments import console

    mode = console.Mode.JSON if as_json else console.Mode.QUIET if quiet else console.Mode.RICH
    console.configure(mode)
    try:
        reclaim_dead_runs(say=not as_json)
        finish(guarded(run), out_dir, as_json)
    finally:
        console.configure(console.Mode.RICH)


@app.command()
def soak(
    spec: SpecArg,
    seed: Annotated[int, typer.Option("--seed", help="the fault schedule's and load's seed")] = 1,
    duration: Annotated[
        float, typer.Option("--duration", help="seconds of load and faults (then a quiesce)")
    ] = 180.0,
    out_dir: OutOpt = Path("reports"),
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """A seeded nemesis under load: faults from the spec's cells on one deployment, checked."""

    def run() -> Verdict:
        from bsrctl.experiments.soak.run import run_soak

        return run_soak(spec, out_dir, seed, duration, quiet or as_json)

    run_experiment(quiet, out_dir, run, as_json)


@app.command()
def roundtrip(
    spec: SpecArg,
    out_dir: OutOpt = Path("reports"),
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Store a prompt's KV, make vLLM forget it, reload it from each tier; check the output."""

    def run() -> Verdict:
        from bsrctl.experiments.roundtrip import run_roundtrip

        return run_roundtrip(spec, out_dir, quiet or as_json)

    run_experiment(quiet, out_dir, run, as_json)


# Experiments that take SPEC --stack --out --quiet and nothing else: (run function, default
# stack: None reads the spec's stack.kind, help). The import happens when the command runs,
# so that vLLM/LMCache load only for it.
EXPERIMENTS = {
    "ladder": (
        "bsrctl.experiments.restore.ladder:run_ladder",
        None,
        "Whole-plan capacity ladder (W = 0): the first L1 rung that passes per prefix size.",
    ),
    "law": (
        "bsrctl.experiments.restore.law:run_law",
        None,
        "Capacity law: restore-pool peak against W, least-squares fit; slope must be c.",
    ),
    "failmatrix": (
        "bsrctl.experiments.failmatrix:run_failmatrix",
        None,
        "Workload x fault matrix: every failed restore ends closed, correct and explained.",
    ),
    "tempokv": (
        "bsrctl.tempokv.experiments:run_tempokv",
        "sim",
        "Run TempoKV and the baseline staging policies on identical seeded traces.",
    ),
}


def _experiment_command(name: str, target: str, default_stack: str | None, doc: str) -> None:
    def command(
        spec: SpecArg,
        stack: StackOpt = default_stack,
        out_dir: OutOpt = Path("reports"),
        quiet: QuietOpt = False,
        as_json: JsonOpt = False,
    ) -> None:
        def run() -> Verdict:
            module, function = target.split(":")
            run_fn = getattr(import_module(module), function)
            return run_fn(spec, out_dir, stack, quiet or as_json)  # type: ignore[no-any-return]

        run_experiment(quiet, out_dir, run, as_json)

    command.__doc__ = doc
    app.command(name)(command)


for _name, (_target, _stack, _doc) in EXPERIMENTS.items():
    _experiment_command(_name, _target, _stack, _doc)


@app.command()
def sweep(
    spec: SpecArg,
    stack: StackOpt = None,
    out_dir: OutOpt = Path("reports"),
    quiet: QuietOpt = False,
    repeat_new_salt: Annotated[
        bool, typer.Option("--repeat-new-salt", help="rerun the largest point, fresh salt")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Window sweep: one deployment, W fixed, prefix sizes in a list (run id br-e1-...)."""

    def run() -> Verdict:
        from bsrctl.experiments.restore.sweep import run_sweep

        return run_sweep(spec, out_dir, stack, quiet or as_json, repeat_new_salt)

    run_experiment(quiet, out_dir, run, as_json)


@app.command()
def doctor(
    model: Annotated[
        Path | None,
        typer.Option("--model", help="a local model folder to check (config.json, weights)"),
    ] = None,
    spec: Annotated[
        Path | None,
        typer.Option("--spec", help="check what this spec's deployment needs of this machine"),
    ] = None,
    vllm_from: Annotated[
        Path | None,
        typer.Option(
            "--vllm-from",
            help="only the surface rows, for the vLLM in this folder (an unpacked wheel or a "
            "pip --target folder; `make compat`)",
        ),
    ] = None,
    lmcache_from: Annotated[
        Path | None,
        typer.Option("--lmcache-from", help="likewise for the LMCache in this folder"),
    ] = None,
) -> None:
    """Versions of every part, the vLLM/LMCache names bsrkv and bsrctl use, the GPU (if
    any), a model folder, a spec's deployment, and what to do about each problem found. A
    machine without a GPU is never failed for it."""
    from rich.markup import escape

    from bsrctl.specs import load_stack_section
    from bsrctl.stack.doctor.command import diagnose
    from bsrctl.stack.doctor.facts import surface
    from bsrctl.stack.doctor.surface import surface_findings

    if vllm_from is not None or lmcache_from is not None:
        sides = {"vllm": vllm_from, "lmcache": lmcache_from}
        roots = {p: guarded(lambda p=p, f=f: side_folder(p, f)) for p, f in sides.items() if f}
        rows = surface_findings(surface(roots))
    else:
        stack = guarded(lambda: load_stack_section(spec)[0]) if spec is not None else None
        rows = diagnose(model=model, stack=stack, where=str(spec))
    for row in rows:  # one line a row at any width (soft_wrap): a log or grep reads it whole
        mark = "[green]ok[/green]" if row.ok else "[red]!![/red]"
        out.print(
            f"{mark} {escape(row.name)}: {escape(row.value)}", highlight=False, soft_wrap=True
        )
        if not row.ok and row.fix:  # escaped: fixes name extras such as '.[gpu]'
            out.print(f"   fix: {escape(row.fix)}", highlight=False, soft_wrap=True)
    raise typer.Exit(0 if all(r.ok or not r.required for r in rows) else 3)


def side_folder(package: str, folder: Path) -> Path:
    """``doctor --vllm-from``'s (``--lmcache-from``'s) folder: the one holding the package."""
    from bsrctl.errors import BadInput

    if not (folder / package).is_dir():
        raise BadInput(
            f"--{package}-from: no {package}/ package folder in {folder}; give the folder that "
            f"holds it (pip install --no-deps --target DIR {package})"
        )
    return folder


@stack_app.command("up")
def stack_up(
    spec: SpecArg,
    run_dir: Annotated[Path, typer.Option("--run-dir", help="stack state and logs")] = Path(
        "reports/stack"
    ),
) -> None:
    """Start the stack a spec's `stack:` and `restore:` sections describe (W = 0) and leave
    it running."""
    from bsrctl.stack.launch import standalone

    def go() -> Any:
        reclaim_dead_runs()
        return standalone.stack_up(spec, run_dir)

    st = guarded(go)
    out.print_json(json.dumps(st.health()))


@stack_app.command("plan")
def stack_plan(
    spec: SpecArg,
    as_json: Annotated[bool, typer.Option("--json", help="{processes, figures} as JSON")] = False,
    vllm_version: Annotated[
        str | None,
        typer.Option("--vllm-version", help="plan for this vLLM release (default: the installed)"),
    ] = None,
) -> None:
    """Every process the spec would start (argv, env) and its figures; starts nothing, needs
    no GPU, reads no model but its config.json."""
    from bsrctl.stack.launch.plan import plan_spec, render

    plan = guarded(lambda: plan_spec(spec, vllm_version))
    sys.stdout.write(json.dumps(plan.to_json()) + "\n" if as_json else render(plan))


RunDirOpt = Annotated[
    Path, typer.Option("--run-dir", help="the stack's state and logs (as given to stack up)")
]


@stack_app.command("status")
def stack_status(run_dir: RunDirOpt = Path("reports/stack")) -> None:
    """Each part's PID, liveness, health and endpoint."""
    from bsrctl.stack.launch.status import status_from_state

    rows = guarded(lambda: status_from_state(run_dir))
    out.print_json(json.dumps(rows))
    raise typer.Exit(0 if rows and all(r["healthy"] for r in rows.values()) else 3)


@stack_app.command("down")
def stack_down(run_dir: RunDirOpt = Path("reports/stack")) -> None:
    """Stop every process the stack started, by PID (SIGTERM, then SIGKILL)."""
    from bsrctl.stack.launch.standalone import stack_down as down

    left = guarded(lambda: down(run_dir))
    if left:
        err.print(f"still alive after SIGKILL: {left}")
        raise typer.Exit(3)
    out.print("stack down")


cli_timeline.register(app, guarded)
cli_fleet.register(app, guarded)  # fleet render | matrix | run | report


def main() -> None:  # pragma: no cover - console entry
    app(prog_name="bsrctl")


if __name__ == "__main__":  # vLLM spawns: guard the entry point
    sys.exit(main())
