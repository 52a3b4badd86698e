"""``bsrctl timeline RUN [--request ID]``: where a request's TTFT went, as its critical path.
Without ``--request``, a restore run's slowest measured restores (``restores``), never its
seeding prefills; any other run's slowest requests."""

from __future__ import annotations

import json
from pathlib import Path

from bsrctl.errors import BadInput
from bsrctl.trace.collect import SPANS, read_spans
from bsrctl.trace.restores import measured_restores
from bsrctl.trace.timeline import by_request, critical_path, render, slowest, spans_of


def timeline_text(run_dir: Path, request: str | None = None, top: int = 3) -> str:
    """The request's critical path, or the ``top`` slowest requests'; BadInput (exit 2)
    naming the fix when the run has no spans or no such request."""
    run = Path(run_dir)
    if not run.is_dir():
        raise BadInput(f"{run}: no such run folder; pass a folder under reports/")
    records = read_spans(run)
    if not records:
        raise BadInput(
            f"{run}: no {SPANS} (a run before tracing, or stack.trace.enabled: false); rerun "
            "with tracing on"
        )
    spans = spans_of(records)
    if request is None:
        evidence = run / "evidence.json"
        doc = json.loads(evidence.read_text()) if evidence.is_file() else {}
        restores = measured_restores(doc, spans)
        paths = slowest(spans if restores is None else restores, top)
        n = len(by_request(spans))
        if not paths:
            what = "request" if restores is None else "measured restore"
            raise BadInput(f"{run}: no {what} has a client span; pass --request ID of one of "
                           f"its {n} request(s)")  # fmt: skip
        if restores is None:
            head = f"{len(paths)} slowest of {n} request(s) in {run}"
        else:
            k = len(by_request(restores))
            head = f"{len(paths)} slowest of {k} measured restore(s) ({n} request(s)) in {run}"
        return "\n\n".join([head, *(render(p) for p in paths)])
    path = critical_path(spans, request)
    if path is None:
        known = sorted(by_request(spans))
        raise BadInput(
            f"--request {request}: not in {run}; its requests: "
            f"{', '.join(known[:5])}{' …' if len(known) > 5 else ''}"
        )
    return render(path)
