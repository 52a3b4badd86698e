"""``bsrctl timeline RUN [--request ID]``: where a request's TTFT went, as its critical path."""

from __future__ import annotations

from pathlib import Path

from bsrctl.errors import BadInput
from bsrkv.trace.collect import SPANS, read_spans
from bsrkv.trace.timeline import by_request, critical_path, render, slowest, spans_of


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
        paths = slowest(spans, top)
        if not paths:
            raise BadInput(f"{run}: no request has a client span; nothing to break down")
        head = f"{len(paths)} slowest of {len(by_request(spans))} request(s) in {run}"
        return "\n\n".join([head, *(render(p) for p in paths)])
    path = critical_path(spans, request)
    if path is None:
        known = sorted(by_request(spans))
        raise BadInput(
            f"--request {request}: not in {run}; its requests: "
            f"{', '.join(known[:5])}{' …' if len(known) > 5 else ''}"
        )
    return render(path)
