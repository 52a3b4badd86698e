"""`bsrctl timeline`: the critical path printed; a bad run or id exits 2 naming the fix."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from bsrctl.cli import app

from .test_timeline import RECORDED, R


def test_timeline_prints_and_bad_input_exits_2(tmp_path) -> None:
    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDED))
    runner = CliRunner()
    ok = runner.invoke(app, ["timeline", str(tmp_path), "--request", R])
    assert ok.exit_code == 0, ok.output
    assert f"request {R}: TTFT 52.000 ms" in ok.output and "bsr.fetch [bsrctl.server]" in ok.output
    top = runner.invoke(app, ["timeline", str(tmp_path)])
    assert top.exit_code == 0 and "1 slowest of 1 request(s)" in top.output
    bad = runner.invoke(app, ["timeline", str(tmp_path), "--request", "nope"])
    assert bad.exit_code == 2 and R in bad.output
    empty = runner.invoke(app, ["timeline", str(tmp_path / "missing")])
    assert empty.exit_code == 2 and "no such run folder" in empty.output
