"""`bsrctl tempokv`: the spec's experiment on the simulated stack in virtual time, each of
the paper's claims judged against the spec's expectation of it. Evidence after every point;
summary.md beside it is rendered from the finished evidence alone (`bsrctl.report.tempokv`),
so `bsrctl report` reproduces it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bsrctl import __version__
from bsrctl.errors import BadInput
from bsrctl.evidence import EvidenceWriter, Verdict, load_evidence, merge
from bsrctl.experiments.tempokv.grid import run_grid
from bsrctl.experiments.tempokv.lead import run_lead
from bsrctl.experiments.tempokv.rank import run_rank
from bsrctl.report.tempokv import render
from bsrctl.tempokv.spec import LeadSweep, PolicyGrid, load

STACKS = ("sim", "serving")
Progress = Callable[[str], None]


def run_tempokv(spec_path: Path, out_dir: Path, stack: str, quiet: bool) -> Verdict:
    """Run the spec's experiment on the sim stack; returns the run verdict."""
    if stack != "sim":
        valid = ", ".join(STACKS)
        raise BadInput(
            f"--stack {stack}: only `sim` is available for tempokv (valid names: {valid}; the "
            "serving integration is not built yet); pass --stack sim"
        )
    spec, raw = load(spec_path)
    say: Progress = (lambda msg: None) if quiet else print
    writer = EvidenceWriter(
        out_dir,
        "tempokv",
        raw,
        salt=f"tempokv-seed-{spec.seed}",
        stack={"kind": "sim", "versions": {"bsrctl": __version__}, "registration": {}},
    )
    try:
        exp = spec.experiment
        if isinstance(exp, PolicyGrid):
            summary, checks = run_grid(spec, exp, writer, say)
        elif isinstance(exp, LeadSweep):
            summary, checks = run_lead(spec, exp, writer, say)
        else:
            summary, checks = run_rank(spec, exp, writer, say)
    except BaseException as exc:
        writer.abort(f"{type(exc).__name__}: {exc}")
        raise
    summary["checks"] = [c.to_json() for c in checks]
    verdict = writer.finish(summary, merge(c.verdict for c in checks))
    (writer.run_dir / "summary.md").write_text(render(load_evidence(writer.path)))
    say(f"{verdict}: {writer.run_dir}")
    return verdict
