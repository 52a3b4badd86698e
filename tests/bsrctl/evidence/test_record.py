import json
import os
import re
from pathlib import Path

import pytest

from bsrctl.evidence import EvidenceWriter, Point, Verdict, load_evidence, new_run_id
from bsrctl.evidence.verdict import Check

STACK = {"kind": "storage"}


def test_run_ids_follow_the_paper_names() -> None:
    assert re.fullmatch(r"br-e1-[0-9a-f]{12}", new_run_id("sweep"))
    assert re.fullmatch(r"br-law-[0-9a-f]{12}", new_run_id("law"))
    assert new_run_id("sweep") != new_run_id("sweep")


def test_each_point_is_on_disk_and_the_run_is_incomplete_until_finished(tmp_path: Path) -> None:
    w = EvidenceWriter(tmp_path, "sweep", {"a": 1}, "salt-1", {"kind": "storage"})
    doc = load_evidence(w.path)
    assert (doc["complete"], doc["verdict"], doc["points"]) == (False, "UNKNOWN", [])
    w.add_point(Point("p1", {"tokens": 1}, {"x": 1}, (Check("c", Verdict.PASS),)))
    doc = load_evidence(w.path)
    assert [p["id"] for p in doc["points"]] == ["p1"]
    # An unfinished run never reads PASS: the points' verdict so far has its own key.
    assert (doc["complete"], doc["verdict"], doc["points_verdict"]) == (False, "UNKNOWN", "PASS")
    assert w.finish({"n": 1}) == Verdict.PASS
    doc = load_evidence(w.path)
    assert (doc["complete"], doc["verdict"], doc["summary"]) == (True, "PASS", {"n": 1})
    assert doc["points_verdict"] == "PASS"
    assert doc["run_id"].startswith("br-e1-") and doc["kind"] == "sweep"
    assert len(doc["spec_sha256"]) == 64 and doc["salt"] == "salt-1"


def test_run_level_verdict_merges_with_points(tmp_path: Path) -> None:
    w = EvidenceWriter(tmp_path, "law", {}, "s", STACK)
    w.add_point(Point("p", {}, {}, (Check("c", Verdict.PASS),)))
    assert w.finish({}, Verdict.FAIL) == Verdict.FAIL


def test_abort_keeps_points_and_says_incomplete(tmp_path: Path) -> None:
    w = EvidenceWriter(tmp_path, "sweep", {}, "s", STACK)
    w.add_point(Point("p", {}, {"v": 3}, (Check("c", Verdict.PASS),)))
    w.abort("interrupted: KeyboardInterrupt")
    doc = load_evidence(w.path)
    assert doc["complete"] is False and doc["verdict"] == "UNKNOWN"
    assert doc["points_verdict"] == "PASS"  # what was measured, kept apart from the verdict
    assert doc["points"][0]["measures"] == {"v": 3}
    assert doc["summary"]["aborted"] == "interrupted: KeyboardInterrupt"


def test_a_run_folder_is_never_reused(tmp_path: Path) -> None:
    w = EvidenceWriter(tmp_path, "sweep", {}, "s", STACK)
    with pytest.raises(FileExistsError):
        EvidenceWriter(tmp_path, "sweep", {}, "s", STACK, run_id=w.run_id)


def test_write_is_atomic_no_temp_left(tmp_path: Path) -> None:
    w = EvidenceWriter(tmp_path, "sweep", {}, "s", STACK)
    for i in range(5):
        w.add_point(Point(f"p{i}", {}, {}, ()))
    assert sorted(os.listdir(w.run_dir)) == ["evidence.json", "manifest.json"]
    assert len(json.loads(w.path.read_text())["points"]) == 5


def test_unknown_kind_lists_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="valid: ladder, sweep"):
        EvidenceWriter(tmp_path, "nope", {}, "s", {})


def test_a_document_breaking_the_schema_is_never_written(tmp_path: Path) -> None:
    from pydantic import ValidationError

    w = EvidenceWriter(tmp_path, "sweep", {}, "s", STACK)
    with pytest.raises(ValidationError, match="stack.kind"):
        w.set_stack({"kind": "toaster"})
    assert load_evidence(w.path)["stack"] == STACK  # the last valid document stays
