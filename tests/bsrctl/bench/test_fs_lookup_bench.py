"""bench/fs_lookup.py: LMCache's stock FS lookup against bsrctl's, real adapters in process.
Two rounds of each mode write its points; the last line has both ratios; bad input is exit 2."""

from __future__ import annotations

import re
import sys

import fs_lookup
import pytest

from bsrctl.evidence import load_evidence


def run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["fs_lookup.py", *argv])
    return fs_lookup.main()


def test_two_rounds_write_a_point_per_adapter_and_load(tmp_path, monkeypatch, capsys) -> None:
    assert run(monkeypatch, "--rounds", "2", "--keys", "6", "--evidence", str(tmp_path)) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(
        r"fs lookup stock/bsr idle=\S+ \[\S+, \S+\] busy=\S+ \[\S+, \S+\] per-lookup ms "
        r"stock/idle=\S+ stock/busy=\S+ bsr/idle=\S+ bsr/busy=\S+",
        out[-1],
    ), out[-1]
    (run_dir,) = tmp_path.iterdir()
    doc = load_evidence(run_dir / "evidence.json")
    assert doc["spec"] == {"bench": "fs_lookup", "rounds": 2, "keys": 6, "evidence": str(tmp_path)}
    assert [p["id"] for p in doc["points"]] == [
        "fs-lookup/stock/idle", "fs-lookup/stock/busy", "fs-lookup/bsr/idle", "fs-lookup/bsr/busy",
    ]  # fmt: skip
    assert all(len(p["samples"]["lookup_s"]) == 2 for p in doc["points"])


@pytest.mark.parametrize("flag", ["--rounds", "--keys"])
def test_a_count_below_one_is_exit_2_naming_it(flag, tmp_path, monkeypatch, capsys) -> None:
    assert run(monkeypatch, flag, "0", "--evidence", str(tmp_path)) == 2
    assert capsys.readouterr().err.strip() == f"{flag} must be >= 1"
    assert not any(tmp_path.iterdir())
