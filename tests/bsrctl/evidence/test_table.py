"""Evidence as a table: the frame of a real storage-stack sweep's evidence (8 points, no
samples), the same with samples added, csv/json/parquet round trips, and `bsrctl export`."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.evidence.schema import validate_evidence
from bsrctl.evidence.table import evidence_frame, load_frame, measure_columns, write_frame

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "evidence" / "sweep-storage.json"
RUN_ID = "br-e1-d2dd255f623b"
HEAD = [
    "run_id", "kind", "spec_sha256", "spec_name", "stack_kind", "started_at", "finished_at",
    "complete", "run_verdict", "point", "point_verdict", "sample", "n_samples",
    "version.bsrctl", "version.lmcache",
    "param.tokens", "param.window_chunks", "param.l1_capacity_bytes",
]  # fmt: skip
MEASURES = [
    "tokens", "window_chunks", "l1_capacity_bytes", "restore_pool_peak_bytes",
    "restore_pool_peak_bytes_by_rank.0", "rws_bound_bytes", "l1_used_peak_bytes",
    "l1_peak_bytes_by_rank.0", "gauge_peak_bytes_by_rank.0", "l1_usage_before_bytes.0",
    "l1_usage_after_bytes.0", "l1_bytes_before_restore", "cached_tokens", "external_hit_tokens",
    "expected_cached_tokens", "cold_cached_tokens", "tier", "tier_bytes_read", "bytes_restored",
    "bytes_restored_source", "bytes_per_chunk_expected", "bytes_per_chunk_measured",
    "bytes_per_chunk_allocated", "l1_allocation_unit_bytes", "registration_digest_expected",
    "registration_digest", "registration_tensors_expected", "registration_tensors_live",
    "registration_tensors_stored", "output_sha256", "canonical_sha256",
    "output_first_divergence", "output_max_logprob_gap", "output_tolerance", "verify_ok",
    "verify_mismatches", "blocks_valid", "blocks_total", "readback", "budget_chunks",
    "windows_done", "restore_modes", "restore_failures", "failure", "forced_local", "ttft_s",
    "restore_s", "probe_s", "seed_chunks_expected", "seed_chunks_held", "seed",
    "seed_objects_written", "seed_s", "healthy", "health_detail", "error",
]  # fmt: skip


def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def sampled() -> dict:
    """The fixture with restore_s and probe_s repeated at its first point (3 samples) and
    restore_s at its second (5), as the repeats convention writes them."""
    doc = copy.deepcopy(fixture())
    p0, p1 = doc["points"][0], doc["points"][1]
    p0["samples"] = {"restore_s": [0.009, 0.008, 0.010], "probe_s": [0.007, 0.0075, 0.008]}
    p0["intervals"] = {"restore_s": [0.008, 0.010], "probe_s": [0.007, 0.008]}
    p1["samples"] = {"restore_s": [0.006, 0.005, 0.007, 0.006, 0.0059]}
    p1["intervals"] = {"restore_s": [0.0059, 0.007]}
    p0["measures"]["restore_s"], p1["measures"]["restore_s"] = 0.009, 0.006
    return doc


def test_frame_of_a_sweep_without_samples() -> None:
    df = evidence_frame([fixture()])
    assert list(df.columns) == HEAD + MEASURES and df.shape == (8, 74)
    assert measure_columns(df) == MEASURES
    assert df["sample"].tolist() == [0] * 8 and df["n_samples"].tolist() == [1] * 8
    assert df["point"].tolist()[:2] == ["n2048-w4", "n2048-w0"]
    assert set(df["run_id"]) == {RUN_ID} and set(df["stack_kind"]) == {"storage"}
    assert df["restore_s"].tolist()[0] == 0.008167
    assert df["registration_tensors_live"][0].startswith('["model.layers.0.self_attn.attn=')


def test_frame_with_samples_a_row_per_sample() -> None:
    doc = sampled()
    validate_evidence(doc)  # the schema takes the optional samples and intervals
    df = evidence_frame([doc, fixture()])
    assert len(df) == (3 + 5 + 6) + 8  # sampled run, then the plain one
    assert list(df.columns) == HEAD + MEASURES + [
        "ci.restore_s.lo", "ci.restore_s.hi", "ci.probe_s.lo", "ci.probe_s.hi",
    ]  # fmt: skip
    first = df[df["point"] == "n2048-w4"].iloc[:3]
    assert first["sample"].tolist() == [0, 1, 2] and set(first["n_samples"]) == {3}
    assert first["restore_s"].tolist() == [0.009, 0.008, 0.010]
    assert set(first["restore_pool_peak_bytes"]) == {1 << 20}  # measured once: every row
    assert set(first["ci.restore_s.lo"]) == {0.008}
    assert df[df["point"] == "n2048-w0"]["restore_s"].iloc[:5].tolist() == [
        0.006, 0.005, 0.007, 0.006, 0.0059,
    ]  # fmt: skip
    # the medians per point are the measures: what every one-number reader sees
    medians = df.iloc[:14].groupby("point", sort=False)["restore_s"].median()
    assert medians.tolist()[:2] == [0.009, 0.006]


def test_schema_refuses_intervals_without_samples() -> None:
    doc = sampled()
    doc["points"][1]["intervals"]["ttft_s"] = [1.0, 2.0]
    with pytest.raises(ValueError, match=r"intervals \['ttft_s'\] have no samples"):
        validate_evidence(doc)
    doc = sampled()
    doc["points"][0]["intervals"]["restore_s"] = [0.01, 0.008]
    with pytest.raises(ValueError, match="lo > hi"):
        validate_evidence(doc)


def test_csv_json_and_parquet_round_trips(tmp_path: Path) -> None:
    df = evidence_frame([sampled()])
    assert write_frame(df, "csv", tmp_path / "t.csv") is None  # written, nothing returned
    back = pd.read_csv(tmp_path / "t.csv")
    assert list(back.columns) == list(df.columns) and len(back) == 14
    assert back["restore_s"].tolist() == df["restore_s"].tolist()
    assert back["point"].tolist() == df["point"].tolist()
    rows = json.loads(write_frame(df, "json", None) or b"")
    assert len(rows) == 14 and rows[0]["restore_s"] == 0.009 and rows[0]["sample"] == 0
    write_frame(df, "parquet", tmp_path / "t.parquet")
    pq = pd.read_parquet(tmp_path / "t.parquet")
    assert list(pq.columns) == list(df.columns) and pq["restore_s"].tolist()[:3] == [
        0.009, 0.008, 0.010,
    ]  # fmt: skip


def run_folder(tmp_path: Path, doc: dict) -> Path:
    folder = tmp_path / doc["run_id"]
    folder.mkdir()
    (folder / "evidence.json").write_text(json.dumps(doc))
    return folder


def test_export_cli(tmp_path: Path) -> None:
    run = run_folder(tmp_path, sampled())
    res = CliRunner().invoke(app, ["export", str(run), "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].startswith("run_id,kind,spec_sha256,spec_name,")
    out = tmp_path / "all.csv"
    res = CliRunner().invoke(app, ["export", str(run), "--format", "csv", "--out", str(out)])
    assert res.exit_code == 0 and len(pd.read_csv(out)) == 14
    assert load_frame([run]).shape == (14, 78)
    res = CliRunner().invoke(app, ["export", str(run), "--format", "xlsx"])
    assert res.exit_code == 2
    assert res.output.startswith("error: --format 'xlsx': one of csv, parquet, json")
    res = CliRunner().invoke(app, ["export", str(run), "--format", "parquet"])
    assert res.exit_code == 2 and "--out FILE" in res.output
    res = CliRunner().invoke(app, ["export", str(tmp_path / "none")])
    assert res.exit_code == 2 and "no evidence.json" in res.output


def test_runs_reads_the_run_columns(tmp_path: Path) -> None:
    run_folder(tmp_path, fixture())
    shutil.copytree(tmp_path / RUN_ID, tmp_path / "copy")  # same run id, another folder
    res = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    rows = json.loads(res.output)
    assert [r["run_id"] for r in rows] == [RUN_ID, RUN_ID]
    assert rows[0]["spec"] == fixture()["spec_sha256"][:12] and rows[0]["stack"] == "storage"
