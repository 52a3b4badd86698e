"""`bsrctl timeline`: the critical path printed; a bad run or id exits 2 naming the fix."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from bsrctl.cli import app

from .test_timeline import RECORDED, R, _rec


def test_timeline_prints_and_bad_input_exits_2(tmp_path) -> None:
    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDED))
    runner = CliRunner()
    ok = runner.invoke(app, ["timeline", str(tmp_path), "--request", R])
    assert ok.exit_code == 0, ok.output
    assert f"request {R}: TTFT 52.000 ms" in ok.output and "bsr.fetch [bsrkv.server]" in ok.output
    top = runner.invoke(app, ["timeline", str(tmp_path)])
    assert top.exit_code == 0 and "1 slowest of 1 request(s)" in top.output
    bad = runner.invoke(app, ["timeline", str(tmp_path), "--request", "nope"])
    assert bad.exit_code == 2 and R in bad.output
    empty = runner.invoke(app, ["timeline", str(tmp_path / "missing")])
    assert empty.exit_code == 2 and "no such run folder" in empty.output


def _seeding(rid: str, ms: int) -> list[dict]:
    """A seeding prefill: a slower request whose spans show LMCache storing it."""
    return [
        _rec("client.request", "bsrctl", 0, ms, {"request_id": rid}, trace=f"s-{rid}", sid=rid),
        _rec("mp.store", "lmcache", 5, ms - 5, {"request_id": rid}, trace=f"m-{rid}"),
    ]


def test_a_restore_runs_slowest_are_its_measured_restores_never_its_seeding(tmp_path) -> None:
    seed = "bsrq-00000000000000bb"
    records = [*RECORDED, *_seeding(seed, 900)]
    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    runner = CliRunner()
    # no evidence (or not a restore run): every request, the seeding prefill first
    every = runner.invoke(app, ["timeline", str(tmp_path), "--top", "1"])
    assert every.exit_code == 0, every.output
    assert "1 slowest of 2 request(s)" in every.output and f"request {seed}:" in every.output
    # a sweep whose points name the restore: that one alone, the seeding still reachable
    doc = {"kind": "sweep", "points": [{"request_ids": [R]}]}
    (tmp_path / "evidence.json").write_text(json.dumps(doc))
    named = runner.invoke(app, ["timeline", str(tmp_path)])
    assert named.exit_code == 0, named.output
    assert "1 slowest of 1 measured restore(s) (2 request(s))" in named.output
    assert f"request {R}: TTFT 52.000 ms" in named.output and seed not in named.output
    # older evidence without ids: the requests whose spans restore and never store
    (tmp_path / "evidence.json").write_text(json.dumps({"kind": "sweep", "points": [{}]}))
    older = runner.invoke(app, ["timeline", str(tmp_path)])
    assert "1 slowest of 1 measured restore(s)" in older.output and seed not in older.output
    # a point naming a request the spans lack: exit 2 naming the way out
    doc = {"kind": "ladder", "points": [{"request_ids": ["bsrq-gone"]}]}
    (tmp_path / "evidence.json").write_text(json.dumps(doc))
    gone = runner.invoke(app, ["timeline", str(tmp_path)])
    assert gone.exit_code == 2
    assert "no measured restore has a client span; pass --request ID" in gone.output
