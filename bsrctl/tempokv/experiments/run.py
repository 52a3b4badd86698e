"""`bsrctl tempokv`: the spec's experiment on the simulated stack in virtual time, each of
the paper's claims judged against the spec's expectation of it. Evidence after every point;
summary.md beside it is rendered from the evidence alone (`bsrctl.tempokv.report`, through
the one run lifecycle), so `bsrctl report` reproduces it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bsrctl import __version__
from bsrctl.errors import BadInput
from bsrctl.evidence import EvidenceWriter, Verdict
from bsrctl.experiments.run import execute, progress
from bsrctl.tempokv.experiments.expectations import JudgedCheck
from bsrctl.tempokv.experiments.grid import run_grid
from bsrctl.tempokv.experiments.lead import run_lead
from bsrctl.tempokv.experiments.rank import run_rank
from bsrctl.tempokv.spec import LeadSweep, PolicyGrid, load

STACKS = ("sim", "serving")


def run_tempokv(spec_path: Path, out_dir: Path, stack: str, quiet: bool) -> Verdict:
    """Run the spec's experiment on the sim or serving stack; returns the run verdict."""
    if stack not in STACKS:
        valid = ", ".join(STACKS)
        raise BadInput(f"--stack {stack}: valid names for tempokv are {valid}")
    spec, raw = load(spec_path)
    say = progress(quiet)
    if stack == "serving":
        if not isinstance(spec.experiment, PolicyGrid):
            raise BadInput(
                f"experiment.kind: {spec.experiment.kind} runs on --stack sim only; the "
                "serving stack runs the policy grid (kind: policies)"
            )
        return _run_serving(spec, raw, out_dir, say)
    writer = _writer(spec, raw, out_dir, "sim")

    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[JudgedCheck]]:
        exp = spec.experiment
        if isinstance(exp, PolicyGrid):
            return run_grid(spec, exp, w, say)
        if isinstance(exp, LeadSweep):
            return run_lead(spec, exp, w, say)
        return run_rank(spec, exp, w, say)

    return execute(writer, body, lambda: None, say)  # virtual time: nothing to tear down


def _run_serving(spec: Any, raw: dict, out_dir: Path, say: Any) -> Verdict:
    from bsrctl.tempokv.experiments.serving import deployment_for, run_serving

    writer = _writer(spec, raw, out_dir, "serving")
    # one deployment for the body and the teardown: stopped by PID whatever happened
    dep, info = deployment_for(spec, writer.run_dir)
    exp = spec.experiment
    return execute(writer, lambda w: run_serving(spec, exp, dep, info, w, say), dep.down, say)


def _writer(spec: Any, raw: dict, out_dir: Path, stack: str) -> EvidenceWriter:
    return EvidenceWriter(
        out_dir,
        "tempokv",
        raw,
        salt=f"tempokv-seed-{spec.seed}",
        stack={"kind": stack, "versions": {"bsrctl": __version__}, "registration": {}},
    )
