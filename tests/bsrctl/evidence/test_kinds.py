"""One registry of evidence kinds: the writer, the schema and the report read it."""

from __future__ import annotations

import pytest

from bsrctl.evidence import kinds, record
from bsrctl.evidence.schema import EvidenceDoc
from bsrctl.report.claims import CLAIMS, claims
from bsrctl.report.kinds import RENDERERS, renderer
from bsrctl.tempokv import report as tempokv_report


def test_every_list_of_kinds_is_the_registrys() -> None:
    assert tuple(kinds.KINDS) == kinds.NAMES == record.KINDS
    assert set(RENDERERS) == set(kinds.NAMES)
    assert tuple(CLAIMS) == kinds.NAMES  # every kind has its claims function
    schema = EvidenceDoc.model_json_schema(by_alias=True)
    assert tuple(schema["properties"]["kind"]["enum"]) == kinds.NAMES


def test_the_sweep_keeps_the_papers_run_prefix() -> None:
    assert record.new_run_id("sweep").startswith("br-e1-")
    assert record.new_run_id("soak").startswith("br-soak-")


def test_a_renderer_is_a_name_under_report_or_a_full_module_path() -> None:
    assert RENDERERS["tempokv"] == "bsrctl.tempokv.report"
    assert renderer("tempokv") is tempokv_report.render
    assert renderer("soak").__module__ == "bsrctl.report.soak"


def test_claims_of_an_unknown_kind_are_refused_naming_the_known_ones() -> None:
    known = ", ".join(repr(k) for k in sorted(kinds.NAMES))
    with pytest.raises(
        ValueError, match=rf"no claims for evidence kind 'paper'; known: \[{known}\]"
    ):
        claims({"kind": "paper", "points": []})
    assert claims({"kind": "soak", "points": []}) == []
