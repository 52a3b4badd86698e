"""`bsrctl runs [DIR]`: the runs under a reports folder, newest first, from their evidence."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


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


def _row(folder: Path, doc: dict[str, Any]) -> RunRow:
    spec = doc.get("spec") or {}
    name = spec.get("name") if isinstance(spec.get("name"), str) else None
    return RunRow(
        run_id=str(doc.get("run_id", folder.name)),
        kind=str(doc.get("kind", "?")),
        spec=name or str(doc.get("spec_sha256", ""))[:12],
        stack=str((doc.get("stack") or {}).get("kind", "?")),
        started_at=str(doc.get("started_at", "")),
        complete=bool(doc.get("complete")),
        verdict=str(doc.get("verdict", "UNKNOWN")),
        path=str(folder),
    )


def list_runs(root: Path, kind: str | None = None, verdict: str | None = None) -> list[RunRow]:
    """Every run folder directly under ``root`` (a folder holding evidence.json), newest
    first; a file that cannot be read is skipped."""
    rows = []
    for ev in Path(root).glob("*/evidence.json"):
        try:
            doc = json.loads(ev.read_text())
        except (OSError, ValueError):
            continue
        row = _row(ev.parent, doc)
        if (kind is None or row.kind == kind) and (verdict is None or row.verdict == verdict):
            rows.append(row)
    return sorted(rows, key=lambda r: (r.started_at, r.run_id), reverse=True)


def render(rows: list[RunRow]) -> str:
    lines = ["run id | kind | spec | stack | started | complete | verdict"]
    lines += [
        f"{r.run_id} | {r.kind} | {r.spec} | {r.stack} | {r.started_at} | "
        f"{'yes' if r.complete else 'no'} | {r.verdict}"
        for r in rows
    ]
    return "\n".join(lines) + "\n"
