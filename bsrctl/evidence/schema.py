"""The evidence.json schema as pydantic models. The writer validates every document it
writes against them, and `bsrctl schema` exports their JSON Schema, so the schema a reader
gets is the one the writer obeys.

The run-level fields are strict (``extra="forbid"``): a field added to the writer must be
added here. What varies by kind (a point's params and measures, the summary, the stack's
extra fields, a point's other extras such as ``superseded_by``) is open; a ladder
rung's ``rung_outcome`` and ``whole_plan_bytes`` are typed.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bsrctl.evidence.kinds import KindName

VerdictName = Literal["PASS", "FAIL", "UNKNOWN"]
# A ladder rung's outcome (bsrctl.experiments.restore.ladder); "capacity": older evidence's
# word for a rung not reused, before the capacity law decided between exceeds and fail.
RungOutcome = Literal["pass", "exceeds", "fail", "unknown", "memory_limit", "capacity"]


class CheckDoc(BaseModel):
    """One check: a stable name, its verdict, why (TempoKV's carry claim, expect, ...)."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    verdict: VerdictName
    detail: str = ""


class PointDoc(BaseModel):
    """One measured point; extras per kind (superseded_by, attempt, ...).

    A repeated measure keeps its median in ``measures`` (so every reader of one number keeps
    working), its raw samples in measurement order in ``samples`` and the 95 % seeded
    bootstrap interval of that median in ``intervals``. Evidence without repeats has neither.
    A nested measure is named by its flattened path (``phases.fetch_s``)."""

    model_config = ConfigDict(extra="allow")
    id: str = Field(min_length=1)
    params: dict[str, Any]
    measures: dict[str, Any]
    checks: list[CheckDoc]
    verdict: VerdictName
    samples: dict[str, list[float]] = Field(
        default_factory=dict, description="measure -> its samples, in measurement order"
    )
    intervals: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="measure -> [lo, hi] of its median (95 %)"
    )
    rung_outcome: RungOutcome | None = Field(
        None, description="ladder: the rung's outcome; exceeds reads EXCEEDS, not FAIL"
    )
    whole_plan_bytes: int | None = Field(
        None, ge=0, description="ladder: L1 bytes the whole plan needs by the capacity law"
    )

    @model_validator(mode="after")
    def _intervals_of_samples(self) -> PointDoc:
        empty = sorted(k for k, v in self.samples.items() if not v)
        if empty:
            raise ValueError(f"samples {empty}: a repeated measure has at least one sample")
        orphans = sorted(set(self.intervals) - set(self.samples))
        if orphans:
            raise ValueError(f"intervals {orphans} have no samples: an interval needs them")
        upside = sorted(k for k, (lo, hi) in self.intervals.items() if lo > hi)
        if upside:
            raise ValueError(f"intervals {upside}: lo > hi")
        return self


class StackDoc(BaseModel):
    """What the run ran on; versions and registration once the stack is deployed."""

    model_config = ConfigDict(extra="allow")
    kind: Literal["serving", "storage", "sim", "attach"]
    versions: dict[str, str] = Field(default_factory=dict)
    registration: dict[str, Any] = Field(default_factory=dict)


class EvidenceDoc(BaseModel):
    """evidence.json (``bsrctl.evidence/1``)."""

    model_config = ConfigDict(extra="forbid", title="bsrctl evidence")
    schema_: Literal["bsrctl.evidence/1"] = Field(alias="schema")
    run_id: str = Field(pattern=r"^br-[a-z0-9]+-[0-9a-f]{12}$")
    kind: KindName
    spec: dict[str, Any]
    spec_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    salt: str
    stack: StackDoc
    started_at: str
    finished_at: str | None
    complete: bool
    points: list[PointDoc]
    summary: dict[str, Any]
    points_verdict: VerdictName = Field(description="the points' merged verdict so far")
    verdict: VerdictName = Field(description="UNKNOWN until the run finishes")


def validate_evidence(doc: dict[str, Any]) -> None:
    """Raise pydantic's ValidationError when the document breaks the schema."""
    EvidenceDoc.model_validate(doc)


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of evidence.json."""
    schema = EvidenceDoc.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://bsrctl/schemas/evidence-1.json"
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
