"""`bsrctl runs [DIR]`: the runs under a reports folder, newest first, from their evidence."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bsrctl.evidence.table import runs_frame


@dataclass(frozen=True)
class RunRow:
    run_id: str
    kind: str
    spec: str  # the spec's name if it has one, else its sha256 prefix
    stack: str
    started_at: str
    complete: bool
    verdict: str
    path: str  # the run folder

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def list_runs(root: Path, kind: str | None = None, verdict: str | None = None) -> list[RunRow]:
    """Every run folder directly under ``root`` (a folder holding evidence.json), newest
    first; a file that cannot be read is skipped. Read through the evidence table's run
    columns (``evidence.table.runs_frame``), filtered and sorted there."""
    df = runs_frame(Path(root))
    if kind is not None:
        df = df[df["kind"] == kind]
    if verdict is not None:
        df = df[df["run_verdict"] == verdict]
    df = df.sort_values(["started_at", "run_id"], ascending=False, kind="stable")
    return [
        RunRow(
            run_id=r.run_id,
            kind=r.kind,
            spec=r.spec_name or r.spec_sha256[:12],
            stack=r.stack_kind,
            started_at=r.started_at,
            complete=bool(r.complete),
            verdict=r.run_verdict,
            path=r.path,
        )
        for r in df.itertuples(index=False)
    ]


def render(rows: list[RunRow]) -> str:
    lines = ["run id | kind | spec | stack | started | complete | verdict"]
    lines += [
        f"{r.run_id} | {r.kind} | {r.spec} | {r.stack} | {r.started_at} | "
        f"{'yes' if r.complete else 'no'} | {r.verdict}"
        for r in rows
    ]
    return "\n".join(lines) + "\n"
