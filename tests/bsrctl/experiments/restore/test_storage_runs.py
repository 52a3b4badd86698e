"""ladder / sweep / law end to end on the storage stack (real LMCache L1 + FS L2), small
geometry: tiny-llama, 262,144 B per 256-token chunk per rank. Seconds; exact bytes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache")

from bsrctl.errors import StackFailed  # noqa: E402
from bsrctl.evidence import Verdict, load_evidence  # noqa: E402
from bsrctl.experiments.restore.ladder import run_ladder  # noqa: E402
from bsrctl.experiments.restore.law import fit_line, run_law  # noqa: E402
from bsrctl.experiments.restore.sweep import run_sweep  # noqa: E402
from bsrctl.stack.contracts.measures import StorageMeasures  # noqa: E402
from bsrctl.stack.contracts.target import Prompt  # noqa: E402
from bsrctl.stack.storage import target as storage_target  # noqa: E402

C = 262_144
MIB = 1 << 20


def evidence(out: Path) -> dict[str, Any]:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return load_evidence(run / "evidence.json")


def by_id(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["id"]: p for p in doc["points"]}


@pytest.mark.parametrize("tp", [1, 2])
def test_sweep_peak_is_w_chunks_at_every_size_and_w0_grows(
    small_spec, tmp_path: Path, tp: int
) -> None:
    out = tmp_path / "out"
    assert run_sweep(small_spec(tp), out, "storage", quiet=True) == Verdict.PASS
    doc = evidence(out)
    assert doc["run_id"].startswith("br-e1-") and len(doc["run_id"]) == len("br-e1-") + 12
    assert (doc["kind"], doc["complete"], doc["verdict"]) == ("sweep", True, "PASS")
    pts = by_id(doc)
    assert list(pts) == [f"n{n}-w{w}" for n in (1024, 2048, 4096) for w in (2, 0)]
    per_rank = C  # tiny-llama with TP = 2 holds one KV head per rank: c halves, 2 ranks
    per_rank = C // tp
    for n in (1024, 2048, 4096):
        bsr, whole = pts[f"n{n}-w2"]["measures"], pts[f"n{n}-w0"]["measures"]
        assert bsr["restore_pool_peak_bytes"] == 2 * per_rank
        assert bsr["restore_pool_peak_bytes_by_rank"] == {str(r): 2 * per_rank for r in range(tp)}
        assert whole["restore_pool_peak_bytes"] == (n // 256) * per_rank
        assert bsr["cached_tokens"] == whole["cached_tokens"] == n
        assert bsr["bytes_restored"] == (n // 256) * C
        assert bsr["windows_done"] == n // 256 // 2
        assert [c["verdict"] for c in pts[f"n{n}-w2"]["checks"]] == ["PASS"] * 7
        assert pts[f"n{n}-w2"]["checks"][-1]["name"] == "repeats_identical"  # 1 + 1 passes
    s = doc["summary"]
    assert s["peak_identical_across_sizes"] is True and s["peak_equals_window_bytes"] is True
    assert s["whole_plan_peak_grows"] is True
    assert [c["name"] for c in s["checks"]] == ["peak_independent_of_n", "whole_plan_grows_with_n"]
    assert (tmp_path / "out" / doc["run_id"] / "summary.md").is_file()
    assert not (tmp_path / "storage" / "l2").exists()  # L2 files removed after the run


def test_sweep_repeat_new_salt_reruns_the_largest_point(small_spec, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run_sweep(small_spec(), out, "storage", True, repeat_new_salt=True) == Verdict.PASS
    doc = evidence(out)
    last = doc["points"][-1]
    assert last["id"] == "n4096-w2-new-salt"
    assert last["params"]["salt"].startswith("t-small-repeat-")
    assert last["measures"]["restore_pool_peak_bytes"] == 2 * C
    assert doc["summary"]["repeat_new_salt"]["verdict"] == "PASS"


def test_law_slope_is_exactly_c(small_spec, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert run_law(small_spec(), out, "storage", quiet=True) == Verdict.PASS
    doc = evidence(out)
    fit = doc["summary"]["fit"]
    assert fit["restore_pool_peak_bytes"] == [w * C for w in (1, 2, 4, 8)]
    assert (fit["slope_bytes_per_chunk"], fit["intercept_bytes"], fit["r2"]) == (C, 0.0, 1.0)
    assert fit["slope_equals_c_exactly"] is True
    assert (
        "law (storage): slope 262144.0 B/chunk vs c = 262144 B (+0.0000%" in capsys.readouterr().out
    )


def test_fit_line_is_exact_least_squares() -> None:
    slope, intercept, r2 = fit_line(
        [8, 16, 32, 64], [8 * C + 5, 16 * C + 5, 32 * C + 5, 64 * C + 5]
    )
    assert (slope, intercept, r2) == (C, 5, 1.0)
    slope, _, r2 = fit_line([1, 2, 3], [1, 3, 2])
    assert slope == 0.5 and r2 == pytest.approx(0.25)
    assert fit_line([1, 2, 3], [4, 4, 4])[2] is None  # flat: R² undefined -> UNKNOWN upstream


def test_ladder_first_passing_rung_and_rungs_the_plan_exceeds(small_spec, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert run_ladder(small_spec(), out, "storage", quiet=True) == Verdict.PASS
    doc = evidence(out)
    pts = by_id(doc)
    # 1024 tokens = 4 chunks = 1 MiB whole plan; 2048 tokens = 2 MiB.
    assert list(pts) == ["n1024-l1-1048576", "n2048-l1-1048576", "n2048-l1-2097152"]
    assert [p["rung_outcome"] for p in doc["points"]] == ["pass", "exceeds", "pass"]
    assert [p["whole_plan_bytes"] for p in doc["points"]] == [MIB, 2 * MIB, 2 * MIB]
    short = pts["n2048-l1-1048576"]
    assert (short["verdict"], short["measures"]["cached_tokens"]) == ("FAIL", 0)
    rows = {r["tokens"]: r for r in doc["summary"]["sizes"]}
    assert rows[1024]["first_passing_rung_bytes"] == MIB
    assert rows[1024]["last_failing_rung_bytes"] is None
    assert rows[2048]["first_passing_rung_bytes"] == 2 * MIB
    assert rows[2048]["last_failing_rung_bytes"] == MIB
    assert (rows[1024]["l1_peak_bytes"], rows[2048]["l1_peak_bytes"]) == (MIB, 2 * MIB)
    assert (rows[1024]["whole_plan_bytes"], rows[2048]["whole_plan_bytes"]) == (MIB, 2 * MIB)
    assert doc["verdict"] == "PASS"  # the rung past L1 is the law's answer, not a failure
    summary = (out / doc["run_id"] / "summary.md").read_text()
    assert "| n2048-l1-1048576 | EXCEEDS | 2048 | 0 | 1 MiB |" in summary
    assert (
        "- n2048-l1-1048576: whole plan 2.00 MiB > L1 rung 1 MiB; cached 0 of 2048 tokens (not "
        "reused, as the law says); no other check failed, stack healthy." in summary
    )
    assert "n2048-l1-1048576 /" not in summary  # not under "Not passing"
    assert "\n| n2048-l1-1048576 | FAIL" not in summary


def test_ladder_rung_that_fails_for_no_capacity_is_unknown_and_redone(
    small_spec, tmp_path: Path, monkeypatch
) -> None:
    real = storage_target.StorageTarget.measure
    calls = {"n": 0}

    def flaky(
        self: Any, prompt: Prompt, w: int, cold: bool = True, oracle: bool = True
    ) -> StorageMeasures:
        calls["n"] += 1
        if calls["n"] == 1:
            raise StackFailed("engine unhealthy: injected")
        return real(self, prompt, w, cold, oracle)

    monkeypatch.setattr(storage_target.StorageTarget, "measure", flaky)
    out = tmp_path / "out"
    assert run_ladder(small_spec(), out, "storage", quiet=True) == Verdict.PASS
    doc = evidence(out)
    first, redo = doc["points"][0], doc["points"][1]
    assert (first["id"], first["rung_outcome"], first["verdict"]) == (
        "n1024-l1-1048576", "unknown", "UNKNOWN")  # fmt: skip
    assert "engine unhealthy: injected" in json.dumps(first["checks"])
    assert first["superseded_by"] == redo["id"] == "n1024-l1-1048576-redo"
    assert (redo["rung_outcome"], redo["verdict"], redo["attempt"]) == ("pass", "PASS", 2)


def test_ladder_stops_where_machine_memory_ends(small_spec, tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec = small_spec()
    spec.write_text(
        spec.read_text().replace("memory_reserve_bytes: 1 MiB", "memory_reserve_bytes: 1 TiB")
    )
    assert run_ladder(spec, out, "storage", quiet=True) == Verdict.UNKNOWN
    doc = evidence(out)
    assert [p["rung_outcome"] for p in doc["points"]] == ["memory_limit", "memory_limit"]
    rows = doc["summary"]["sizes"]
    assert [r["memory_ends_at_rung_bytes"] for r in rows] == [MIB, MIB]
    assert "machine memory ends at rung 1 MiB" in doc["summary"]["checks"][0]["detail"]


# ---- interrupts: evidence valid, complete=false; a rerun never merges --------------------


def _interrupt_second_point(monkeypatch, how: str) -> None:
    """Interrupt the measure after the first point is written: the accuracy round (6 arms),
    then the timed round's first arm (n1024-w2) completes its point."""
    real = storage_target.StorageTarget.measure
    calls = {"n": 0}

    def measure(self: Any, *a: Any, **k: Any) -> StorageMeasures:
        calls["n"] += 1
        if calls["n"] == 8:
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(storage_target.StorageTarget, "measure", measure)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupted_sweep_leaves_valid_incomplete_evidence(
    small_spec, tmp_path: Path, monkeypatch, how: str
) -> None:
    out = tmp_path / "out"
    spec = small_spec()
    _interrupt_second_point(monkeypatch, how)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, out, "storage", quiet=True)
    doc = evidence(out)
    assert (doc["complete"], doc["verdict"]) == (False, "UNKNOWN")
    assert [p["id"] for p in doc["points"]] == ["n1024-w2"]
    assert doc["summary"]["aborted"].startswith("interrupted: ")
    if how == "sigterm":
        assert "SIGTERM" in doc["summary"]["aborted"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(
        signal.getsignal(signal.SIGTERM)
    )
    first = doc["run_id"]
    monkeypatch.undo()
    assert run_sweep(spec, out, "storage", quiet=True) == Verdict.PASS
    runs = sorted(p.name for p in out.iterdir())
    assert len(runs) == 2 and first in runs
    again = load_evidence(out / first / "evidence.json")
    assert again == doc  # the interrupted record is untouched: never merged
    (new,) = [r for r in runs if r != first]
    assert len(load_evidence(out / new / "evidence.json")["points"]) == 6


# ---- each acceptance check made to fail on purpose, on the real storage stack ---------------


@pytest.fixture
def target(small_spec, tmp_path: Path):
    from bsrctl.experiments.restore.spec import load_experiment

    spec, _ = load_experiment(small_spec(), "sweep", "storage")
    t = storage_target.StorageTarget(spec, tmp_path / "run")
    t.deploy(8 * MIB, spec.settings(2))
    yield t
    t.cleanup()


def checks_of(m: StorageMeasures) -> dict[str, tuple[str, str]]:
    from bsrctl.experiments.restore.acceptance import judge

    return {c.name: (str(c.verdict), c.detail) for c in judge(m)}


def test_clean_point_passes(target) -> None:
    got = checks_of(target.measure(Prompt("s", 2048), 2))
    assert {v for v, _ in got.values()} == {"PASS"}


def test_wrong_salt_fails_byte_verification(target, monkeypatch) -> None:
    st = target.stack
    real_seed = st.seed

    def seed_then_claim_other_salt(tokens: int, salt: str, **k: Any) -> Any:
        res = real_seed(tokens, salt, **k)  # the stored state is salt s ...
        st.seeded = dataclasses.replace(st.seeded, salt="other")  # ... judged as "other"
        return res

    monkeypatch.setattr(st, "seed", seed_then_claim_other_salt)
    got = checks_of(target.measure(Prompt("s", 2048), 2))
    assert got["canonical_bytes"][0] == "FAIL"
    assert "8 object(s) not canonical" in got["canonical_bytes"][1]


def test_emptied_tier_fails_accounting_and_isolation_is_unknown(target, monkeypatch) -> None:
    st = target.stack
    real_forget = st.forget

    def forget_and_empty_l2() -> int:
        for f in st.l2_dir.iterdir():
            f.unlink()
        return real_forget()

    monkeypatch.setattr(st, "forget", forget_and_empty_l2)
    m = target.measure(Prompt("s", 2048), 2)
    got = checks_of(m)
    assert m.cached_tokens == 0
    assert got["cached_token_accounting"] == ("FAIL", "cached 0, expected 2048")
    assert got["tier_isolation"][0] == "UNKNOWN"
    assert got["canonical_bytes"][0] == "UNKNOWN"  # nothing restored: nothing verified


def test_l1_not_emptied_fails_tier_isolation(target, monkeypatch) -> None:
    st = target.stack
    real_seed = st.seed
    monkeypatch.setattr(st, "seed", lambda t, s, **k: real_seed(t, s, into_l1=True))
    monkeypatch.setattr(st, "forget", lambda: 0)
    got = checks_of(target.measure(Prompt("s", 1024), 2))
    assert got["tier_isolation"] == ("FAIL", f"L1 held {4 * C} B before the request: not emptied")


def test_altered_bytes_fail_canonical_bytes(target, monkeypatch) -> None:
    st = target.stack
    real_forget = st.forget

    def forget_and_corrupt() -> int:
        victim = sorted(st.l2_dir.iterdir())[0]
        data = bytearray(victim.read_bytes())
        data[100] ^= 0xFF
        victim.write_bytes(bytes(data))
        return real_forget()

    monkeypatch.setattr(st, "forget", forget_and_corrupt)
    got = checks_of(target.measure(Prompt("s", 2048), 2))
    assert (
        got["canonical_bytes"][0] == "FAIL"
        and "1 object(s) not canonical" in got["canonical_bytes"][1]
    )


def test_unhealthy_stack_fails_post_request_health(target, monkeypatch) -> None:
    monkeypatch.setattr(target.stack, "health", lambda: False)
    got = checks_of(target.measure(Prompt("s", 2048), 2))
    assert got["post_request_health"][0] == "FAIL"
    assert "StorageManagers healthy: False" in got["post_request_health"][1]


# ---- `bsrctl report` reproduces what the run wrote, from the evidence alone ----------------


@pytest.mark.parametrize("command", ["sweep", "law", "ladder"])
def test_report_reproduces_the_summary_byte_for_byte(small_spec, tmp_path: Path, command) -> None:
    from typer.testing import CliRunner

    from bsrctl.cli import app

    run = {"sweep": run_sweep, "law": run_law, "ladder": run_ladder}[command]
    out = tmp_path / "out"
    run(small_spec(), out, "storage", quiet=True)
    (run_dir,) = out.iterdir()
    written = (run_dir / "summary.md").read_text()
    assert written.startswith(f"# {run_dir.name} ({command}): ")
    table = [line for line in written.splitlines() if line.startswith("|")]
    assert table and not any("None" in line for line in table)  # unmeasured: no column
    (run_dir / "summary.md").unlink()
    res = CliRunner().invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert (run_dir / "summary.md").read_text() == written
