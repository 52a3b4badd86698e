"""Figure 6's regime in virtual time (``bench/tempokv/fig6_regime.py``): the flash-tier spec
at the paper's scale, where timing staging gains over Demand and where it cannot. Virtual
time is exact, so the values are too."""

from __future__ import annotations

import sys
from pathlib import Path

import fig6_regime as regime
import pytest
import yaml
from fig6 import dax

from bsrctl.tempokv.spec import TempoKVSpec


def _spec() -> TempoKVSpec:
    return TempoKVSpec.model_validate(yaml.safe_load(dax.SPEC.read_text()))


def test_the_paper_scale_spec_is_the_flash_tier_specs() -> None:
    s = regime.paper_spec(_spec(), "queued", 4.0, 5)
    assert s.workload.documents_tokens == [
        34600, 16080, 63904, 20304, 41296, 59696, 17504, 31200, 67744, 18896, 55800, 37904,
        25000, 47000, 22000, 50000,
    ]  # fmt: skip
    assert (s.device.staging_gib_s, s.device.fast_tier_gib, s.device.budget_fraction) == (
        11.0, 100.0, 0.5)  # fmt: skip
    assert s.device.retrieval_gib_s == 16.1
    assert (s.engine.max_seqs, s.engine.loads, s.engine.gpu_kv_gib) == (4, "queued", None)
    assert s.workload.arrivals.interval_s == 0.25 and s.workload.output.max_tokens == 32
    assert s.seed == 5
    small = regime.paper_spec(_spec(), "sync", 2.0, 6, gpu_kv_gib=12.0, retrieval_gib_s=790.0)
    assert (small.engine.gpu_kv_gib, small.device.retrieval_gib_s) == (12.0, 790.0)
    assert small.engine.loads == "sync" and small.workload.arrivals.interval_s == 0.5


def _rounded(got, loads: str, rate: float) -> tuple[tuple[float, ...], ...]:
    cell = got[(loads, rate)]
    return tuple(
        (round(p.p95_s, 3), round(p.tok_s, 1), round(p.idle_wait_s, 3), round(p.engine_s, 3))
        for policy in regime.POLICIES
        for p in cell[policy]
    )


def test_only_a_baseline_that_leaves_flash_idle_can_be_beaten() -> None:
    got = regime.grid(_spec(), [0.5, 4.0], [5])
    # sync loads: Demand's reads wait for a slot while the batch stalls on the one loading,
    # flash idles while requests wait, and TempoKV fills that time
    assert _rounded(got, "sync", 4.0) == SYNC_4
    # queued loads (vLLM 0.32 with LMCache's MP connector): every waiting request that fits
    # the GPU's KV loads at once, flash never idles while one waits, nothing to gain
    assert _rounded(got, "queued", 4.0) == QUEUED_4
    for loads in regime.LOADS:  # no queue at 0.5 rps: the policies are one
        d, t = got[(loads, 0.5)]["demand"][0], got[(loads, 0.5)]["tempokv"][0]
        assert (t.p95_s, t.tok_s) == (d.p95_s, d.tok_s) and d.idle_wait_s == 0.0
    assert regime.last_line(got) == LAST


def test_a_gpu_kv_of_a_few_documents_leaves_flash_idle_under_queued_loads() -> None:
    got = regime.grid(_spec(), [4.0], [5], gpu_kv_gib=12.0)
    assert _rounded(got, "queued", 4.0) == QUEUED_4_KV12


def test_the_engine_scale_scales_every_step_cost() -> None:
    base = regime.make_profile(regime.MODEL)
    half = regime.scaled(base, 0.5)
    for f in ("step_base_s", "token_s", "attn_pair_s", "decode_ctx_token_s"):
        assert getattr(half.cost, f) == getattr(base.cost, f) * 0.5
    assert (half.kv_bytes_per_token, half.gpu_kv_gib) == (base.kv_bytes_per_token, base.gpu_kv_gib)


def test_bad_input_exits_2_naming_it(monkeypatch, capsys) -> None:
    fs = Path(__file__).resolve().parents[3] / "ladders" / "tempokv-serving.yaml"
    monkeypatch.setattr(sys, "argv", ["regime", str(fs)])
    assert regime.main() == 2
    assert capsys.readouterr().err.startswith("error: serving.fast_tier: the regime is the flash")
    for argv in (["--seeds", "0"], ["--engine-scale", "0"], ["--gpu-kv-gib", "-1"], ["x"]):
        monkeypatch.setattr(sys, "argv", ["regime", *argv])
        with pytest.raises(SystemExit) as e:
            regime.main()
        assert e.value.code == 2
    assert "--gpu-kv-gib -1.0: give a number > 0" in capsys.readouterr().err


# (p95 s, tok/s, flash idle while waiting s, engine after the KV is in s) of Demand, then
# TempoKV, seed 5
SYNC_4 = ((8.972, 36.7, 6.115, 2.716), (5.091, 53.3, 1.758, 1.938))
QUEUED_4 = ((3.151, 67.6, 0.0, 0.481), (3.151, 67.6, 0.0, 0.481))
QUEUED_4_KV12 = ((7.843, 40.2, 5.155, 0.467), (4.089, 59.8, 0.923, 0.457))
LAST = (
    "fig6-regime tput tempokv/demand sync @0.5=1 @4=1.45 tput tempokv/demand queued @0.5=1 "
    "@4=1 p95 tempokv/demand sync @0.5=1 @4=0.567 p95 tempokv/demand queued @0.5=1 @4=1"
)


def test_demand_reads_at_the_demand_rate_and_tempokv_stages_at_the_staging_rate() -> None:
    """The same knob as the live bench: LMCache-DAX's (Demand's) reads at ratio x the
    staging rate. Under queued loads at 4 rps Demand's longer reads queue the engine and
    TempoKV, staging at the full rate, keeps its p95 of ratio 1 (QUEUED_4)."""
    got = regime.grid(_spec(), [4.0], [5], demand_ratio=0.4236, loads_modes=("queued",))
    assert list(got) == [("queued", 4.0)]
    assert _rounded(got, "queued", 4.0) == QUEUED_4_R042
    assert _rounded(got, "queued", 4.0)[1] == QUEUED_4[1]  # TempoKV: the staging rate's
    faster = regime.grid(_spec(), [4.0], [5], demand_ratio=1.0, staging_gib_s=22.0,
                         loads_modes=("queued",))  # fmt: skip
    assert faster[("queued", 4.0)]["demand"][0].p95_s < QUEUED_4[0][0]


QUEUED_4_R042 = ((13.292, 29.6, 0.0, 0.42), (3.151, 67.6, 0.0, 0.481))
