"""evidence.json: rewritten atomically after every point, so a crash keeps what was measured.

Until ``finish`` the run's ``verdict`` is UNKNOWN, whatever the points say: a run killed
after its second point must never read PASS. The points' merged verdict so far is kept
under ``points_verdict``."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bsrctl.evidence.kinds import KINDS as REGISTRY
from bsrctl.evidence.kinds import NAMES
from bsrctl.evidence.manifest import write_manifest
from bsrctl.evidence.schema import validate_evidence
from bsrctl.evidence.verdict import Point, Verdict, merge
from bsrkv.atomic import write_atomic

SCHEMA = "bsrctl.evidence/1"
KINDS = NAMES  # the registry's (bsrctl.evidence.kinds)
RUN_PREFIX: dict[str, str] = {name: k.run_prefix for name, k in REGISTRY.items() if k.run_prefix}


def new_run_id(kind: str) -> str:
    return f"br-{RUN_PREFIX.get(kind, kind)}-{secrets.token_hex(6)}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def spec_sha256(spec: dict[str, Any]) -> str:
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def atomic_write_json(path: Path, doc: dict[str, Any]) -> None:
    """Readers see old or new, never half; fsync'd, so a crash keeps the last point."""
    text = json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n"
    write_atomic(path, text.encode(), durable=True)


class EvidenceWriter:
    """Owns one run folder. Each add_point() and finish() rewrites evidence.json whole."""

    def __init__(
        self,
        out_dir: Path,
        kind: str,
        spec: dict[str, Any],
        salt: str,
        stack: dict[str, Any],
        run_id: str | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown evidence kind {kind!r}; valid: {', '.join(KINDS)}")
        self.run_id = run_id or new_run_id(kind)
        self.run_dir = Path(out_dir) / self.run_id
        if self.run_dir.exists():
            raise FileExistsError(f"run folder {self.run_dir} exists; a run id is never reused")
        self.run_dir.mkdir(parents=True)
        self.path = self.run_dir / "evidence.json"
        self.doc: dict[str, Any] = {
            "schema": SCHEMA,
            "run_id": self.run_id,
            "kind": kind,
            "spec": spec,
            "spec_sha256": spec_sha256(spec),
            "salt": salt,
            "stack": stack,
            "started_at": now_iso(),
            "finished_at": None,
            "complete": False,
            "points": [],
            "summary": {},
            "points_verdict": str(Verdict.UNKNOWN),
            "verdict": str(Verdict.UNKNOWN),
        }
        # Called with each point's JSON once it is on disk (the run's console listens).
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self._flush()

    @property
    def points(self) -> list[dict[str, Any]]:
        return self.doc["points"]

    def set_stack(self, stack: dict[str, Any]) -> None:
        self.doc["stack"] = stack
        self._flush()

    def add_point(self, point: Point) -> None:
        self.doc["points"].append(point.to_json())
        self.doc["points_verdict"] = str(self._points_verdict())  # the run's stays UNKNOWN
        self._flush()
        write_manifest(self.run_dir)  # the sums of every file so far: `bsrctl verify`
        for listener in self.listeners:
            listener(self.doc["points"][-1])

    def finish(self, summary: dict[str, Any], verdict: Verdict | None = None) -> Verdict:
        """Close the run. The run verdict merges the points and any run-level verdict given."""
        points = self._points_verdict()
        merged = points if verdict is None else merge([points, verdict])
        self.doc.update(
            summary=summary,
            finished_at=now_iso(),
            complete=True,
            points_verdict=str(points),
            verdict=str(merged),
        )
        self._flush()
        return merged

    def abort(self, reason: str) -> None:
        """Stopped early: keep what was measured, say complete=false and why."""
        self.doc.update(finished_at=now_iso(), complete=False, verdict=str(Verdict.UNKNOWN))
        self.doc["summary"] = {**self.doc.get("summary", {}), "aborted": reason}
        self._flush()

    def _points_verdict(self) -> Verdict:
        return merge(Verdict(p["verdict"]) for p in self.doc["points"])

    def _flush(self) -> None:
        validate_evidence(self.doc)  # the schema `bsrctl schema` exports is the one obeyed
        atomic_write_json(self.path, self.doc)


def load_evidence(path: Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {doc.get('schema')!r} is not {SCHEMA!r}")
    return doc
