"""One registry of evidence kinds: the writer, the schema and the report read it."""

from __future__ import annotations

from bsrctl.evidence import kinds, record
from bsrctl.evidence.schema import EvidenceDoc
from bsrctl.report.kinds import RENDERERS


def test_every_list_of_kinds_is_the_registrys() -> None:
    assert tuple(kinds.KINDS) == kinds.NAMES == record.KINDS
    assert set(RENDERERS) == set(kinds.NAMES)
    schema = EvidenceDoc.model_json_schema(by_alias=True)
    assert tuple(schema["properties"]["kind"]["enum"]) == kinds.NAMES


def test_the_sweep_keeps_the_papers_run_prefix() -> None:
    assert record.new_run_id("sweep").startswith("br-e1-")
    assert record.new_run_id("soak").startswith("br-soak-")
