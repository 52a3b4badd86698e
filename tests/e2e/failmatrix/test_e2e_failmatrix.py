"""End to end on the real serving stack: ONE deployment for the whole module, loaded with the
TEST-ONLY mutant server module (with no mutation it is the real module). A cell first PASSes
unmutated (the rig is fair), then each serving cell of matrices/cpu.yaml runs against a
deliberately broken restore and must FAIL on the check that sees the break."""

from __future__ import annotations

from pathlib import Path

import pytest

from bsrctl.evidence.verdict import Verdict
from bsrctl.experiments.failmatrix import ServingRig, load_matrix
from bsrctl.stack.launch.process import pids_alive
from tests.bsrctl.failmatrix.serving_mutants import MUTANT_SERVER, set_mutations

pytestmark = pytest.mark.e2e
MATRICES = Path(__file__).parents[3] / "matrices"

# cell -> (mutations, a check that must FAIL)
BREAKS = {
    "window-timeout": (["skip_invalidation"], "no_valid_block_after_failure"),
    "object-corrupted": (["skip_invalidation"], "no_valid_block_after_failure"),
    "object-truncated": (["skip_force_local"], "force_local"),
    "l1-exhausted": (["partial_lookup", "skip_invalidation"], "cached_prefix_all_or_nothing"),
    "mooncake-down-before-request": (["partial_lookup"], "cached_prefix_all_or_nothing"),
    "mooncake-killed-mid-restore": (["skip_invalidation"], "no_valid_block_after_failure"),
    "mooncake-down-fs-emptied": (
        ["ghost_hits", "skip_invalidation"],
        "no_valid_block_after_failure",
    ),
    # no force-local marker: nothing keeps the next lookup off the failing tier (vLLM #55297)
    "load-fails-always": (["skip_force_local"], "force_local"),
    "slow-tier": (["skip_invalidation"], "no_valid_block_after_failure"),
}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory):
    try:
        import mooncake  # noqa: F401
    except Exception as exc:
        pytest.skip(f"mutant module or mooncake unavailable ({exc!r})")
    spec, _ = load_matrix(MATRICES / "cpu.yaml")
    run_dir = tmp_path_factory.mktemp("failmatrix-e2e")
    r = ServingRig(spec, run_dir, lambda _: None, MUTANT_SERVER)
    try:
        r.prepare([c for c in spec.cells if c.stack == "serving"])
        yield r
    finally:
        r.close()
        pids = [p for part in r.stack.launched for p in [part.pid, *part._children] if p]
        assert pids_alive(pids) == [], f"left running: {pids_alive(pids)}"


def cell(rig: ServingRig, cid: str):
    return next(c for c in rig.spec.cells if c.id == cid)


def test_rig_is_fair_unmutated_cell_passes(rig: ServingRig) -> None:
    set_mutations(rig, [])
    point = rig.run_cell(cell(rig, "window-timeout"))
    assert point.verdict == Verdict.PASS, [c for c in point.checks if c.verdict != "PASS"]
    assert [c.name for c in point.checks][-1] == "extensions_healthy"  # read, and none failed
    assert point.measures["cached_tokens"] == 0
    assert point.measures["recovered_delta"] >= 1


@pytest.mark.parametrize("cid", list(BREAKS))
def test_cell_fails_against_a_broken_restore(rig: ServingRig, cid: str) -> None:
    mutations, must_fail = BREAKS[cid]
    set_mutations(rig, [])  # setup seeds with the real restore; the break comes after it
    try:
        point = rig.run_cell(cell(rig, cid), after_seed=lambda: set_mutations(rig, mutations))
    finally:
        set_mutations(rig, [])
    failed = {c.name: c.detail for c in point.checks if c.verdict == Verdict.FAIL}
    assert point.verdict == Verdict.FAIL
    assert must_fail in failed, {c.name: (c.verdict, c.detail) for c in point.checks}
    # the fault and the broken restore are not the extension failing: no guard counted
    assert "extensions_healthy" not in failed, failed


def test_a_guard_failure_in_the_server_fails_the_cell_by_name(rig: ServingRig) -> None:
    """The books after the cell's restore raise once inside the LMCache server (the module's
    guard keeps the restore's answer): every other check of the fair cell still PASSes,
    and the verdict FAILs on ``extensions_healthy`` alone, naming the site."""
    set_mutations(rig, [])
    try:
        point = rig.run_cell(
            cell(rig, "window-timeout"),
            after_seed=lambda: set_mutations(rig, ["guard_failure_once"]),
        )
    finally:
        set_mutations(rig, [])
    not_passing = {c.name: c.detail for c in point.checks if c.verdict != Verdict.PASS}
    assert point.verdict == Verdict.FAIL
    assert not_passing == {
        "extensions_healthy": "extension degraded to stock: LMCache server: "
        "bsrkv.lmcache_ext.server [restore_books] RuntimeError x1"
    }
    assert point.measures["guards"] == [
        {
            "source": "LMCache server",
            "failures": [{"guard": "bsrkv.lmcache_ext.server", "site": "restore_books",
                          "type": "RuntimeError", "count": 1}],
            "note": "",
        }
    ]  # fmt: skip


# the cells of more than one request (failmatrix.scenarios): unmutated, each PASSes with
# the check only it has, on this module's deployment
SCENARIOS = {
    "concurrent-restores": "every_prefix_restored",
    "whole-plan-past-l1": "bsr_restores_same_prefix",
    "mooncake-master-restarted": "hits_after_new_store",
}


@pytest.mark.parametrize("cid", list(SCENARIOS))
def test_multi_request_cell_passes(rig: ServingRig, cid: str) -> None:
    set_mutations(rig, [])
    point = rig.run_cell(cell(rig, cid))
    by = {c.name: c for c in point.checks}
    assert point.verdict == Verdict.PASS, {n: (c.verdict, c.detail) for n, c in by.items()}
    assert by[SCENARIOS[cid]].verdict == Verdict.PASS
    assert by["extensions_healthy"].detail == "no guard failure in LMCache server"
    m = point.measures
    if cid == "concurrent-restores":  # 16 at once; B = 4 chunks of 256 KiB is the bound
        rows = m["per_request"]
        assert [r["tokens"] for r in rows] == [1024, 2048, 3072, 4000] * 4
        assert [r["cached_tokens"] for r in rows] == [1023, 2047, 3071, 3840] * 4
        assert m["pool_bound_bytes"] == 4 * 262144 and m["pool_peak_bytes"] <= 4 * 262144
    elif cid == "whole-plan-past-l1":  # the whole plan cannot be held: recomputed, then BSR
        assert m["cached_tokens"] == 0 and m["tokens"] == 9216
        assert by["fault_injected"].detail.startswith("the whole plan is 36 chunks = 9437184 B")
        assert "cached 9215 of 9215" in by["bsr_restores_same_prefix"].detail
    else:  # no stale hit from the restarted master; a new store hits again
        assert m["cached_tokens"] == 0
        assert "cached 3840 of 3840" in by["hits_after_new_store"].detail


# The soak (bsrctl soak) on this module's deployment: its spec's stack and settings are the
# matrix's (tests/bsrctl/soak/test_spec.py), so it shares the deployment instead of starting one.
SOAK = MATRICES / "soak-cpu.yaml"


def soak_run(
    rig: ServingRig, out: Path, duration_s: float, mutations: list[str], seed: int = 1
) -> tuple[Verdict, dict]:
    """Seeded with the real restore; ``mutations`` switched on after it, off at the end."""
    from bsrctl.evidence import load_evidence
    from bsrctl.experiments.soak.run import run_soak

    set_mutations(rig, [])
    try:
        verdict = run_soak(SOAK, out, seed, duration_s, quiet=True, deployment=rig.deployment,
                           after_seed=lambda: set_mutations(rig, mutations))  # fmt: skip
    finally:
        set_mutations(rig, [])
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return verdict, load_evidence(run / "evidence.json")


# Seed 8 for 90 s places 10 faults of all five kinds (seed 1 needs 180 s to reach the
# truncated object and the slow tier): the whole fault menu in half the time.
SOAK_SEED, SOAK_S = 8, 90.0


def test_soak_seed_8_for_90_s_has_no_violation(rig: ServingRig, tmp_path: Path) -> None:
    from dataclasses import asdict

    from bsrctl.experiments.soak.schedule import make_schedule
    from bsrctl.experiments.soak.spec import load_soak

    verdict, doc = soak_run(rig, tmp_path / "soak", SOAK_S, [], SOAK_SEED)
    s = doc["summary"]
    assert (verdict, s["violations"]) == (Verdict.PASS, []), s["line"]
    spec, _ = load_soak(SOAK)
    cells = tuple(c.id for c in spec.cells)
    n = len(spec.soak.prefix_tokens)
    replay = make_schedule(SOAK_SEED, SOAK_S, cells, spec.soak.mean_gap_s, spec.windows(), n)
    assert s["schedule"] == [asdict(f) for f in replay.faults]  # the same seed, the same faults
    assert {f["fault"] for f in s["schedule"]} == set(cells)  # every kind of fault
    armed = s["armed"]
    assert [a["index"] for a in armed] == list(range(len(armed)))  # in order, none skipped
    assert s["faults_injected"] == sum(a["placed"] for a in armed) >= 5
    assert s["requests_completed"] == s["requests_sent"] == len(doc["points"]) >= 30
    assert all(p["verdict"] == "PASS" for p in doc["points"])
    rounds: dict[int, list[int]] = {}
    for p in doc["points"]:
        rounds.setdefault(p["params"]["round"], []).append(p["params"]["prefix"])
    assert all(len(set(ps)) == len(ps) == 3 for ps in rounds.values())  # distinct, 3 at once
    assert {p["params"]["fault"] for p in doc["points"]} - {None}  # requests ran under faults
    q = s["quiesced"]
    assert q["markers"] == q["budget_in_use_chunks"] == q["tracked_requests"] == 0, q
    assert list(q["pool_level_bytes_by_rank"].values()) == [0], q  # one rank, nothing held
    assert 0 < s["pool_peak_max_bytes"] <= s["pool_bound_bytes"] == 4 * 262_144
    assert s["line"] == (
        f"violations: 0; faults injected: {s['faults_injected']}; "
        f"requests completed: {s['requests_completed']}"
    )


def test_soak_with_a_mutant_that_skips_invalidation_names_the_request(
    rig: ServingRig, tmp_path: Path
) -> None:
    verdict, doc = soak_run(rig, tmp_path / "soak", 25.0, ["skip_invalidation"])
    s = doc["summary"]
    assert verdict == Verdict.FAIL
    fail_open = [v for v in s["violations"] if v["kind"] == "fail_open"]
    assert fail_open, s["violations"]
    for v in fail_open:
        point = next(p for p in doc["points"] if p["id"] == f"r{v['request']:04d}")
        assert point["verdict"] == "FAIL" and point["params"]["fault"] == v["fault"] is not None
        assert f"request {v['request']} " in v["detail"] and "yet vLLM used" in v["detail"]
