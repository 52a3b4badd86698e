"""`bsrctl compare`: deltas matched by point id, points in one run listed, the gate's exit
codes (0 within bounds, 1 a regression naming metric and delta, 2 different kinds or specs)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.report.compare import Bound, Incomparable, compare

MIB = 1 << 20


def doc(run_id: str, restore: dict[str, float], kind: str = "sweep", spec: str = "a") -> dict:
    return {
        "run_id": run_id,
        "kind": kind,
        "spec_sha256": spec * 64,
        "points": [
            {
                "id": pid,
                "verdict": "PASS",
                "measures": {"restore_s": s, "restore_pool_peak_bytes": MIB, "cached_tokens": 1024},
            }
            for pid, s in restore.items()
        ],
    }


def test_deltas_by_point_id_and_points_in_one_run_listed() -> None:
    base = doc("br-e1-000000000001", {"n1": 0.010, "n2": 0.020, "gone": 0.5})
    new = doc("br-e1-000000000002", {"n2": 0.030, "n1": 0.011, "extra": 0.1})
    c = compare(base, new, [Bound.parse("restore_s:20")])
    assert (c.only_base, c.only_new) == (("gone",), ("extra",))
    by = {(d.point, d.metric): d for d in c.deltas}
    assert by[("n2", "restore_s")].change_pct == pytest.approx(50.0)
    assert by[("n1", "restore_s")].change_pct == pytest.approx(10.0)
    ((d, b),) = c.regressions
    assert (d.point, d.metric, b.pct) == ("n2", "restore_s", 20.0)


def test_lower_is_worse_for_cached_tokens() -> None:
    base = doc("br-e1-000000000001", {"n1": 0.01})
    new = copy.deepcopy(base)
    new["points"][0]["measures"]["cached_tokens"] = 512
    ((d, _),) = compare(base, new, [Bound.parse("cached_tokens:10")]).regressions
    assert (d.worse_pct, d.change_pct) == (50.0, -50.0)
    assert compare(new, base, [Bound.parse("cached_tokens:10")]).regressions == ()


def test_refuses_other_kinds_specs_and_unknown_metrics() -> None:
    base = doc("br-e1-000000000001", {"n1": 0.01})
    with pytest.raises(Incomparable, match="compare runs of one kind"):
        compare(base, doc("br-law-000000000002", {"n1": 0.01}, kind="law"), [])
    with pytest.raises(Incomparable, match="different specs"):
        compare(base, doc("br-e1-000000000002", {"n1": 0.01}, spec="b"), [])
    with pytest.raises(ValueError, match="no point measures \\['restore_z'\\]"):
        compare(base, base, [Bound.parse("restore_z:5")])
    for bad in ("restore_s", "restore_s:-1", ":5", "restore_s:x"):
        with pytest.raises(ValueError, match="METRIC:PCT"):
            Bound.parse(bad)


def write(tmp_path: Path, d: dict[str, Any]) -> Path:
    full = {"schema": "bsrctl.evidence/1", **d}
    folder = tmp_path / d["run_id"]
    folder.mkdir()
    (folder / "evidence.json").write_text(json.dumps(full))
    return folder


def test_cli_exit_codes(tmp_path: Path) -> None:
    base = write(tmp_path, doc("br-e1-000000000001", {"n1": 0.010}))
    slow = write(tmp_path, doc("br-e1-000000000002", {"n1": 0.050}))
    same = write(tmp_path, doc("br-e1-000000000003", {"n1": 0.011}))
    law = write(tmp_path, doc("br-law-000000000004", {"n1": 0.01}, kind="law"))
    run = CliRunner().invoke
    res = run(app, ["compare", str(base), str(slow), "--fail-on", "restore_s:50"])
    assert res.exit_code == 1, res.output
    assert res.output.splitlines()[-1] == (
        "REGRESSION restore_s at n1: 10.0 ms → 50.0 ms (+400.0%), worse by +400.0% > bound 50%"
    )
    res = run(app, ["compare", str(base), str(same), "--fail-on", "restore_s:50"])
    assert (res.exit_code, res.output.splitlines()[-1]) == (0, "no regression beyond a bound")
    res = run(app, ["compare", str(base), str(law)])
    assert res.exit_code == 2 and res.output.startswith("error: BASE is a sweep run and NEW a law")
