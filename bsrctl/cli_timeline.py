"""The ``timeline`` command (registered by ``bsrctl.cli``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer


def register(app: typer.Typer, guarded: Callable[[Callable[[], Any]], Any]) -> None:
    @app.command()
    def timeline(
        run: Annotated[Path, typer.Argument(help="a run folder (with spans.jsonl)")],
        request: Annotated[
            str | None, typer.Option("--request", help="a request id (bsrq-…)")
        ] = None,
        top: Annotated[int, typer.Option("--top", help="how many slowest requests")] = 3,
    ) -> None:
        """Where a request's TTFT went, phase by phase (the critical path from client send
        to first token); without --request, the slowest requests'."""
        from bsrctl.trace.command import timeline_text

        typer.echo(guarded(lambda: timeline_text(run, request, top)))
