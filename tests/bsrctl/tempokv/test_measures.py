"""TempoKV's measures are typed and the evidence on disk is unchanged: a real serving run's
evidence (tests/data/evidence/tempokv-serving-measures.json: its points' measures and summary
rows as the run wrote them, before the types) reads back as the types and writes back byte
for byte; a simulated run writes the keys it always wrote; any record reads back as itself."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bsrctl.tempokv.experiments.cells import simulate_policy
from bsrctl.tempokv.measures import (
    LeadMeasures,
    OracleLeadMeasures,
    PerRepeat,
    PooledMeasures,
    RankMeasures,
    RepeatMeasures,
    SimMeasures,
    point_measures,
    policy_rows,
    sim_fields,
)
from bsrctl.tempokv.sim.models import make_profile
from bsrctl.tempokv.spec import load

EVIDENCE = Path(__file__).resolve().parents[2] / "data/evidence/tempokv-serving-measures.json"
LADDERS = Path(__file__).resolve().parents[3] / "ladders"


def _doc() -> dict:
    return json.loads(EVIDENCE.read_text())


def test_a_serving_runs_evidence_reads_back_and_writes_back_unchanged() -> None:
    doc = _doc()
    assert len(doc["points"]) == 14 and doc["summary"]["repeats"] == 2
    for p in doc["points"]:
        m, guards = point_measures(p["measures"])
        assert guards == p["measures"]["guards"]
        back = {**m.to_json(), "guards": guards}
        assert json.dumps(back) == json.dumps(p["measures"])  # same keys, order and values
    rows = policy_rows(doc["summary"])
    assert list(rows) == list(doc["summary"]["policies"])  # the run's order
    for policy, row in rows.items():
        assert json.dumps(row.to_json()) == json.dumps(doc["summary"]["policies"][policy])
    t = rows["tempokv"]
    assert (t.repeats, t.requests, t.slo_ttft_s) == (2, 12, 2.0)
    assert isinstance(t.per_repeat, PerRepeat) and len(t.per_repeat.p95_ttft_s) == 2


def test_an_unknown_or_missing_measure_is_refused_by_name() -> None:
    row = _doc()["summary"]["policies"]["tempokv"]
    with pytest.raises(ValueError, match=r"unknown PooledMeasures key\(s\) \['p99_ttft_s'\]"):
        PooledMeasures.from_json({**row, "p99_ttft_s": 1.0})
    del row["c_mib_s_per_req"]
    with pytest.raises(ValueError, match=r"PooledMeasures misses \['c_mib_s_per_req'\]"):
        PooledMeasures.from_json(row)
    bad = {**row["per_repeat"], "c": [1.0]}
    with pytest.raises(ValueError, match=r"unknown PerRepeat key\(s\) \['c'\]"):
        PerRepeat.from_json(bad)


_num = st.floats(allow_nan=False, allow_infinity=False, width=64) | st.just(math.nan)
_floats = st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=5).map(tuple)
_ints = st.integers(0, 1 << 40)
_opt_num = st.none() | _num


def _eq(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN (json.dumps writes both as NaN)."""
    return json.dumps(a, sort_keys=False) == json.dumps(b, sort_keys=False)


_repeat = st.builds(
    RepeatMeasures,
    ttfts_s=_floats, makespan_s=_num, output_tokens=_ints, p95_ttft_s=_num, mean_ttft_s=_num,
    output_tok_s=_num, c_byte_s=_num, c_mib_s_per_req=_num, model_c_byte_s=_num,
    model_c_mib_s_per_req=_num, peak_locked_bytes=_ints, peak_reserved_bytes=_ints,
    budget_bytes=_ints, canonical=_ints, requests=_ints, committed=_ints, deferred_claims=_ints,
    claims=_ints, reports_dropped_since_start=st.dictionaries(st.text(max_size=8), _ints),
    retrievals=st.dictionaries(st.text(max_size=8), st.sampled_from(["READY", "MISSED"])),
    ttr_error_s=_floats, ttr_error_abs_p50_s=_num, ttr_error_abs_p95_s=_num, ttu_error_s=_floats,
    slo_ttft_s=_opt_num, goodput_requests=st.none() | _ints, goodput_share=_opt_num,
    goodput_req_s=_opt_num, flash_read_bytes=st.none() | _ints,
)  # fmt: skip
_per_repeat = st.builds(
    PerRepeat, p95_ttft_s=_floats, c_mib_s_per_req=_floats, output_tok_s=_floats,
    committed=st.lists(_ints, max_size=5).map(tuple), claims=st.lists(_ints, max_size=5).map(tuple),
    goodput_share=st.none() | _floats,
)  # fmt: skip
_pooled = st.builds(
    PooledMeasures,
    repeats=_ints, p95_ttft_s=_num, mean_ttft_s=_num, output_tok_s=_num, c_byte_s=_num,
    c_mib_s_per_req=_num, model_c_mib_s_per_req=_num, peak_locked_bytes=_ints,
    peak_reserved_bytes=_ints, budget_bytes=_ints, canonical=_ints, requests=_ints,
    committed=_ints, claims=_ints, deferred_claims=_ints, ttr_error_s=_floats,
    ttr_error_abs_p50_s=_num, ttr_error_abs_p95_s=_num, ttu_error_s=_floats,
    per_repeat=_per_repeat, slo_ttft_s=_opt_num, goodput_share=_opt_num, goodput_req_s=_opt_num,
)  # fmt: skip


@given(_repeat)
def test_a_repeats_measures_read_back_as_themselves(m: RepeatMeasures) -> None:
    j = json.loads(json.dumps(m.to_json()))  # through the file, as evidence stores it
    back = RepeatMeasures.from_json(j)
    assert _eq(back.to_json(), m.to_json())
    assert all(v is not None for v in j.values())  # an unset optional measure has no key


@given(_pooled)
def test_a_pooled_row_reads_back_as_itself(m: PooledMeasures) -> None:
    j = json.loads(json.dumps(m.to_json()))
    back = PooledMeasures.from_json(j)
    assert _eq(back.to_json(), m.to_json())
    assert isinstance(back.per_repeat, PerRepeat)


_opt_int = st.none() | _ints
_sim = st.builds(
    SimMeasures,
    c_gib_s_per_req=_num, p95_ttft_s=_num, mean_ttft_s=_num, output_tok_s=_num,
    deferred_commits=_ints, capacity_refusals=_ints, ordinary_retrievals=_ints, completed=_ints,
    requests=_ints, peak_reserved_gib=_num, budget_gib=_num, makespan_s=_num,
    oracle_iterations=_opt_int, oracle_converged=st.none() | st.booleans(),
    oracle_moved_s=_opt_num, oracle_delayed_claims=_opt_int,
    oracle_early_gib_s_per_req=_opt_num,
)  # fmt: skip


@given(_sim, _num, _num, _num)
def test_the_simulations_measures_read_back_as_themselves(m: SimMeasures, a, b, c) -> None:
    for typed in (m, LeadMeasures(**sim_fields(m), ttft_s=a, lead_byte_time_gib_s=b,
                                  footprint_gib=c)):  # fmt: skip
        j = json.loads(json.dumps(typed.to_json()))
        assert _eq(type(typed).from_json(j).to_json(), typed.to_json())
    lead = OracleLeadMeasures(**sim_fields(m), lead_s=a, ttft_s=b).to_json()
    assert list(lead)[-2:] == ["lead_s", "ttft_s"]  # after the run's, as points always had
    r = RankMeasures(time_to_ready_s=a, margin_s=b, oracle_commit_s=c, oracle_margin_s=a)
    assert _eq(RankMeasures.from_json(json.loads(json.dumps(r.to_json()))).to_json(), r.to_json())


def test_a_simulated_run_writes_the_keys_it_always_wrote() -> None:
    spec, _ = load(LADDERS / "tempokv-fig4.yaml")
    res = simulate_policy(spec, make_profile("llama-3.1-8b"), 1.0, 100.0, "immediate", False)
    assert list(res.measures().to_json()) == [
        "c_gib_s_per_req", "p95_ttft_s", "mean_ttft_s", "output_tok_s", "deferred_commits",
        "capacity_refusals", "ordinary_retrievals", "completed", "requests",
        "peak_reserved_gib", "budget_gib", "makespan_s",
    ]  # fmt: skip
