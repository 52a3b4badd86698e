"""The regression gate on the storage stack: a run whose FS tier was slowed on purpose (the
fault adapter's delay rule, armed through its control file by real means) makes `bsrctl
compare` exit 1 naming the metric and the delta; two runs without the fault exit 0."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.evidence import Verdict, load_evidence

pytest.importorskip("lmcache")

SPEC = (Path(__file__).resolve().parents[2] / "data" / "small-storage-stack.yaml").read_text()
SPEC += """\
sweep:
  sizes_tokens: [4096, 8192]
  window_chunks: 2
  whole_plan_contrast: false
  repeats: 1  # this test is the single-sample gate (bound only); default 5 since repeats
"""
DELAY = {"rules": [{"action": "delay", "phase": "load", "delay_s": 0.1}]}
GATE = ["--fail-on", "restore_s:400", "--fail-on", "restore_pool_peak_bytes:0"]


def sweep(spec: Path, out: Path) -> Path:
    from bsrctl.experiments.restore.sweep import run_sweep

    assert run_sweep(spec, out, "storage", quiet=True) == Verdict.PASS
    return max(out.iterdir(), key=lambda p: p.stat().st_mtime)


def test_a_slowed_tier_fails_the_gate_and_an_unchanged_one_passes(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    root = tmp_path / "storage"
    spec.write_text(SPEC.format(tp=1, root=root, salt="t-gate"))
    base = sweep(spec, tmp_path / "base")
    root.mkdir(exist_ok=True)
    (root / "faults-fs.json").write_text(json.dumps(DELAY))  # arms the FS tier's wrapper
    slow = sweep(spec, tmp_path / "slow")
    (root / "faults-fs.json").unlink()
    again = sweep(spec, tmp_path / "again")

    doc = load_evidence(slow / "evidence.json")
    assert doc["stack"]["fault_control"] == DELAY  # the slowed run says so in its evidence
    assert "fault_control" not in load_evidence(again / "evidence.json")["stack"]
    peaks = {p["measures"]["restore_pool_peak_bytes"] for p in doc["points"]}
    assert peaks == {2 * 262_144}  # slower, not bigger: the window still bounds the pool

    res = CliRunner().invoke(app, ["compare", str(base), str(slow), *GATE])
    assert res.exit_code == 1, res.output
    lines = [s for s in res.output.splitlines() if s.startswith("REGRESSION")]
    assert {s.split()[3].rstrip(":") for s in lines} == {"n4096-w2", "n8192-w2"}
    for line in lines:  # names the metric and the delta
        m = re.fullmatch(
            r"REGRESSION restore_s at (\S+): ([\d.]+) ms → ([\d.]+) ms \(\+([\d.]+)%\), "
            r"worse by \+[\d.]+% > bound 400%",
            line,
        )
        assert m, line
        assert float(m[3]) >= 700 and float(m[4]) > 400  # 8 windows × 0.1 s at least

    res = CliRunner().invoke(app, ["compare", str(base), str(again), *GATE])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-1] == "no regression beyond a bound"
