"""`bsrctl failmatrix`: run the cells of a matrix, one evidence point per cell, and render
summary.md (``bsrctl.report.failmatrix``) from the evidence whatever happened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bsrctl.errors import BadInput
from bsrctl.evidence import EvidenceWriter, Verdict
from bsrctl.evidence.verdict import Check
from bsrctl.experiments.failmatrix.checks import table
from bsrctl.experiments.failmatrix.rig import Say
from bsrctl.experiments.failmatrix.serving import ServingRig
from bsrctl.experiments.failmatrix.spec import FailMatrixSpec, load_matrix
from bsrctl.experiments.failmatrix.storage import (
    StorageStackFactory,
    run_storage_cell,
    storage_registration,
)
from bsrctl.experiments.run import RunConsole, execute, progress
from bsrctl.specs import select_stack, stack_selection
from bsrctl.stack.launch.extensions import ServerModule
from bsrctl.stack.launch.serving import check_ports
from bsrctl.stack.launch.versions import dist_version

STACKS = ("serving", "storage", "attach")  # storage: the storage cells alone


def run_failmatrix(spec_path: Path, out_dir: Path, stack: str | None = None, quiet: bool = False):
    """Run every cell of the matrix; one evidence point per cell. Returns the verdict."""
    return run_matrix(spec_path, out_dir, stack, progress(quiet))


def run_matrix(
    spec_path: Path,
    out_dir: Path,
    stack: str | None,
    say: Say,
    only: list[str] | None = None,
    server_module: ServerModule | None = None,
    storage_stack: StorageStackFactory | None = None,
) -> Verdict:
    """`only`: cell ids to run. `server_module` and `storage_stack` replace the serving
    stack's LMCache server module and the storage cells' stack (the tests substitute broken
    ones to see the matrix FAIL); the summary records that they were substituted. `stack`
    (``--stack``) overrides the spec's ``stack.kind`` for this run."""
    if stack is not None and stack not in STACKS:  # before anything is read
        raise BadInput(f"--stack: {stack!r} is not one of {', '.join(STACKS)}")
    spec, raw = load_matrix(spec_path)
    spec = select_stack(spec, stack, STACKS)
    selection = stack_selection(spec, stack)
    kind = spec.stack.kind
    cells = [c for c in spec.cells if only is None or c.id in only]
    if only is not None and len(cells) != len(set(only)):
        valid = ", ".join(c.id for c in spec.cells)
        raise BadInput(f"unknown cell id(s) in {only}; valid: {valid}")
    skipped = [c.id for c in cells if kind == "storage" and c.stack == "serving"]
    cells = [c for c in cells if c.id not in skipped]
    serving = [c for c in cells if c.stack == "serving"]
    if serving and kind == "serving":  # a port in use: bad input before any run folder
        check_ports(spec.stack)
    writer = EvidenceWriter(out_dir, "failmatrix", raw, spec.workload.salt, selection)
    substitutes = _substitutes(server_module, storage_stack)
    rig: ServingRig | None = None

    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        nonlocal rig
        if serving:
            rig = ServingRig(spec, w.run_dir, say, server_module)
            rig.prepare(serving)
            w.set_stack({**rig.deployment.describe(), **selection})
        elif cells:  # storage cells only: what they ran on, for the report's provenance
            w.set_stack({**_storage_stack(spec), **selection})
        if isinstance(say, RunConsole):
            say.expect(len(cells))
        for cell in cells:
            say(f"cell {cell.id}: {cell.fault} {cell.at} (expect {cell.expect})")
            if cell.stack == "serving":
                assert rig is not None
                point = rig.run_cell(cell)
            else:
                point = run_storage_cell(spec, cell, w.run_dir, storage_stack)
            w.add_point(point)  # the run's console prints its line
        return _summary(w.points, skipped, substitutes), []

    def teardown() -> None:
        if rig is not None:
            rig.close()

    return execute(writer, body, teardown, say)


def _storage_stack(spec: FailMatrixSpec) -> dict[str, Any]:
    reg = storage_registration(spec)
    versions = {d: v for d in ("lmcache", "bsrctl") if (v := dist_version(d)) is not None}
    return {"kind": "storage", "versions": versions, "registration": reg.to_dict()}


def _substitutes(
    module: ServerModule | None, storage_stack: StorageStackFactory | None
) -> dict[str, Any] | None:
    if module is None and storage_stack is None:
        return None
    server = None if module is None else {"path": module.module_path, "config": dict(module.config)}
    stack = getattr(storage_stack, "__qualname__", repr(storage_stack)) if storage_stack else None
    return {"server_module": server, "storage_stack": stack}


def _summary(
    points: list[dict[str, Any]], skipped: list[str], substitutes: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "table": table(points),
        "time_to_fallback_s": {p["id"]: p["measures"].get("time_to_fallback_s") for p in points},
        "skipped_cells": skipped,
        **({"substitutes_test_only": substitutes} if substitutes is not None else {}),
    }
