"""Every kind's evidence validates against the exported JSON Schema (an independent
validator: jsonschema); `bsrctl runs` lists them newest first with filters; a finished run's
folder verifies against its manifest, before and after `bsrctl report`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bsrctl.cli import app

jsonschema = pytest.importorskip("jsonschema")
KINDS = ["sweep", "law", "ladder", "failmatrix", "tempokv"]


@pytest.fixture(scope="module")
def schema() -> dict:
    res = CliRunner().invoke(app, ["schema"])
    assert res.exit_code == 0
    doc = json.loads(res.output)
    jsonschema.Draft202012Validator.check_schema(doc)
    return doc


@pytest.mark.parametrize("kind", KINDS)
def test_every_kinds_evidence_validates(schema: dict, make_run, kind: str) -> None:
    doc = json.loads((make_run(kind) / "evidence.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    assert doc["kind"] == kind and doc["complete"] is True


def test_the_schema_rejects_what_the_writer_never_writes(schema: dict, make_run) -> None:
    doc = json.loads((make_run("sweep") / "evidence.json").read_text())
    for broken in (
        {**doc, "verdict": "MAYBE"},
        {**doc, "surprise": 1},
        {k: v for k, v in doc.items() if k != "points_verdict"},
        {**doc, "run_id": "run-1"},
        {**doc, "points": [{**doc["points"][0], "checks": [{"name": "x"}]}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)


def test_runs_lists_newest_first_and_filters(make_run, tmp_path: Path) -> None:
    for kind in ("sweep", "law", "failmatrix"):
        shutil.copytree(make_run(kind), tmp_path / make_run(kind).name)
    (tmp_path / "not-a-run").mkdir()
    res = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    started = [r["started_at"] for r in rows]
    assert started == sorted(started, reverse=True) and len(rows) == 3
    assert {r["kind"] for r in rows} == {"sweep", "law", "failmatrix"}
    assert all(r["complete"] and r["verdict"] == "PASS" for r in rows)
    res = CliRunner().invoke(app, ["runs", str(tmp_path), "--kind", "law"])
    lines = res.output.splitlines()
    assert lines[0] == "run id | kind | spec | stack | started | complete | verdict"
    assert len(lines) == 2 and lines[1].startswith(f"{make_run('law').name} | law | ")
    res = CliRunner().invoke(app, ["runs", str(tmp_path), "--verdict", "FAIL"])
    assert res.output.splitlines()[1:] == []
    res = CliRunner().invoke(app, ["runs", str(tmp_path), "--verdict", "maybe"])
    assert res.exit_code == 2


def test_a_finished_run_verifies_before_and_after_report(make_run, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(make_run("law"), run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())["files"]
    assert {"evidence.json", "summary.md"} <= set(manifest)
    assert CliRunner().invoke(app, ["verify", str(run_dir)]).exit_code == 0
    assert CliRunner().invoke(app, ["report", str(run_dir)]).exit_code == 0
    res = CliRunner().invoke(app, ["verify", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert "report.html" in json.loads((run_dir / "manifest.json").read_text())["files"]
