"""The oracle: commits each claim at the latest instant that is stage-ready when its
retrieval begins in its own run, found by replaying the run until the retrieval instants
stop moving. Round numbers as in test_engine: every step 10 ms, a 1 GiB object stages in
1/8 s and transfers in 1/16 s.

Its limits, with ample protected capacity: p95 TTFT at Immediate's (nothing waits on
staging that could have been ready), and C at Demand's where nothing forces it off the
just-in-time point. Two things do, and the measures say how much: serialised staging (two
retrievals closer than the second claim's staging: the first must be stage-ready early,
`oracle_early_gib_s_per_req`), and claims it could not commit at their planned start (the
device still busy with earlier, late staging, or the budget full: `oracle_delayed_claims`).
Where either is non-zero, C ≤ 1.02 × Demand's is not a limit of this model and is not
asserted (the Figure 4 test below pins by how much it is exceeded there). Nor where a sync
pass loads several claims at once: its step waits for the longest load, so Demand's own
staging of a smaller claim can end under another's transfer, after the retrieval begins,
delaying nothing and protecting for less than the oracle's stage-ready at that instant
(pinned below)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from bsrctl.tempokv.experiments.cells import simulate_policy
from bsrctl.tempokv.measures import SimMeasures
from bsrctl.tempokv.sim.device import DeviceConfig
from bsrctl.tempokv.sim.models import ModelProfile, make_profile
from bsrctl.tempokv.sim.oracle import MAX_ITERATIONS, simulate_oracle
from bsrctl.tempokv.sim.run import ControlConfig, SimResult, simulate
from bsrctl.tempokv.sim.workload import Request
from bsrctl.tempokv.spec import load
from bsrkv.tempokv.kv import GIB, prefix_manifest
from bsrkv.tempokv.ttu import CostModel, EngineLimits

STEP = CostModel(step_base_s=0.01, token_s=0.0, attn_pair_s=0.0, decode_ctx_token_s=0.0)
MODEL = ModelProfile("flat", GIB // 256, STEP)
DEVICE = DeviceConfig(8 * GIB, contention=0.0, concurrency=1, retrieval_bytes_s=16 * GIB)
CONTROL = ControlConfig(tick_s=0.0, output_limit_tokens=10, output_prior_tokens=(10,))
LADDERS = Path(__file__).resolve().parents[3] / "ladders"


def req(name: str, arrival_s: float, chunks: int, output: int) -> Request:
    cached = 256 * chunks
    manifest = prefix_manifest(name, cached, 256, GIB // 256)
    return Request(name, arrival_s, arrival_s, name, cached + 8, cached, output, manifest)


def trace(res, cid: str) -> list[tuple[float, str]]:
    return [(round(float(t), 6), str(s)) for t, s in res.claim_traces[cid]]


def test_close_retrievals_stage_back_to_back_latest_first():
    # One slot: a decodes 40 tokens; b (1 GiB) is retrieved when a ends (0.5875), c (2 GiB)
    # 72.5 ms later when b's one-token request ends. c needs the device for 0.25 s before
    # 0.66, so b must be ready by 0.41 and starts at 0.285 (less the 1 µs guard): the
    # latest schedule on one FIFO device. c is ready a µs before its retrieval.
    reqs = [req("a", 0.0, 1, 40), req("b", 0.01, 1, 1), req("c", 0.02, 2, 1)]
    res = simulate_oracle(reqs, MODEL, DEVICE, EngineLimits(1), CONTROL)
    assert trace(res, "b")[1:3] == [(0.284999, "STAGING"), (0.409999, "STAGEREADY")]
    assert trace(res, "c")[1:3] == [(0.409999, "STAGING"), (0.659999, "STAGEREADY")]
    assert [lg.retrieval_s for lg in res.logs] == [0.0, 0.5875, pytest.approx(0.66)]
    m = res.measures()
    assert (m.oracle_converged, m.oracle_iterations) == (True, 1)
    # Nothing waits on staging that could have been ready: Immediate's TTFTs exactly.
    imm = simulate(reqs, MODEL, DEVICE, EngineLimits(1), CONTROL, "immediate").measures()
    assert m.p95_ttft_s == imm.p95_ttft_s
    # b waits stage-ready 0.1775 s for c's staging: C exceeds Demand's by exactly that
    # (1 GiB × 0.1775 s over 3 requests), and no more.
    dem = simulate(reqs, MODEL, DEVICE, EngineLimits(1), CONTROL, "demand").measures()
    assert m.oracle_early_gib_s_per_req == pytest.approx(0.1775 / 3, abs=1e-6)
    assert m.c_gib_s_per_req - m.oracle_early_gib_s_per_req == pytest.approx(
        dem.c_gib_s_per_req, abs=1e-5
    )


def test_an_unplanned_claim_never_commits_before_its_hit():
    # A single request: its retrieval is its arrival, nothing can be earlier; the oracle
    # commits on the hit, as Immediate and Demand do.
    res = simulate_oracle([req("a", 0.3, 2, 2)], MODEL, DEVICE, EngineLimits(1), CONTROL)
    assert trace(res, "a")[:3] == [(0.3, "PLANNED"), (0.3, "STAGING"), (0.55, "STAGEREADY")]


def _workload(shape: list[tuple[float, int, int, int]]) -> list[Request]:
    t, out = 0.0, []
    for i, (gap, chunks, uncached, output) in enumerate(shape):
        t += gap
        doc, cached = f"d{i % 3}", 256 * chunks
        manifest = prefix_manifest(doc, cached, 256, GIB // 256)
        out.append(Request(f"r{i}", t, t, doc, cached + uncached, cached, output, manifest))
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 0.5), st.integers(1, 4), st.integers(1, 64), st.integers(1, 8)),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["sync", "async"]),
    st.booleans(),
    st.integers(1, 4),
    st.sampled_from([0.0, 0.173]),
)
def test_with_ample_protected_capacity_the_oracle_is_the_limit(
    shape, loads, release, max_seqs, contention
):
    reqs = _workload(shape)
    limits = EngineLimits(max_seqs, sync_loads=loads == "sync", release_at_first_step=release)
    device = DeviceConfig(8 * GIB, contention, 1, 16 * GIB, 1000 * GIB, 500 * GIB)
    control = ControlConfig(tick_s=0.05, output_limit_tokens=8, output_prior_tokens=(8,))
    workload = f"{shape} loads={loads} release_at_first_step={release} max_seqs={max_seqs}"
    note(workload)
    o = simulate_oracle(reqs, MODEL, device, limits, control).measures()
    assert o.oracle_converged, (
        f"the oracle's fixed point did not converge in {MAX_ITERATIONS} replays on "
        f"{workload} (contention {contention}); its instants still moved "
        f"{o.oracle_moved_s:.3g} s"
    )
    imm = simulate(reqs, MODEL, device, limits, control, "immediate").measures()
    assert o.p95_ttft_s <= 1.02 * imm.p95_ttft_s
    dem_run = simulate(reqs, MODEL, device, limits, control, "demand")
    dem = dem_run.measures()
    if loads == "sync" and _loads_together(dem_run):
        event("a sync pass loads several claims: Demand's staging can hide under another's")
    elif o.oracle_early_gib_s_per_req == 0 and o.oracle_delayed_claims == 0:
        event("just in time everywhere: C against Demand's asserted")
        assert o.c_gib_s_per_req <= 1.02 * dem.c_gib_s_per_req
    else:
        event("serialised or delayed staging: C against Demand's not a limit")


def _loads_together(run: SimResult) -> bool:
    """Some scheduling pass started the retrievals of two requests at once."""
    starts = [lg.retrieval_s for lg in run.logs if lg.retrieval_s is not None]
    return len(set(starts)) < len(starts)


def test_a_sync_pass_loading_several_claims_lets_demand_protect_less():
    # Found by the property above: r2 (1 GiB, not resident) is retrieved in the same pass as
    # r3 and r4 (resident), whose 3 GiB transfer the step waits for. Demand stages r2 from
    # its retrieval (1.0725 s) and is ready at 1.1975 s, inside that wait; the oracle is
    # stage-ready at the retrieval itself, so it protects r2 for 0.125 s more.
    shape = [(0.0, 1, 1, 1), (0.5, 3, 1, 1), (0.0, 1, 1, 1), (0.0, 1, 1, 1), (0.0, 3, 1, 1)]
    reqs = _workload(shape)
    limits = EngineLimits(3, sync_loads=True, release_at_first_step=True)
    device = DeviceConfig(8 * GIB, 0.0, 1, 16 * GIB, 1000 * GIB, 500 * GIB)
    control = ControlConfig(tick_s=0.05, output_limit_tokens=8, output_prior_tokens=(8,))
    o = simulate_oracle(reqs, MODEL, device, limits, control)
    d = simulate(reqs, MODEL, device, limits, control, "demand")
    assert _loads_together(d)
    assert [lg.retrieval_s for lg in d.logs][2:] == [1.0725] * 3
    oracle_r2, demand_r2 = ([(round(t, 4), state) for t, state in run.claim_traces["r2"]]
                            for run in (o, d))  # fmt: skip
    assert oracle_r2[1:3] == [(0.9475, "STAGING"), (1.0725, "STAGEREADY")]
    assert demand_r2[1:3] == [(1.0725, "STAGING"), (1.1975, "STAGEREADY")]
    assert oracle_r2[-1] == demand_r2[-1] == (1.27, "RELEASED")
    om, dm = o.measures(), d.measures()
    assert (om.oracle_early_gib_s_per_req, om.oracle_delayed_claims) == (0.0, 0)
    assert round(om.c_gib_s_per_req, 7) == 0.6055004
    assert round(dm.c_gib_s_per_req, 7) == 0.5805
    assert round(om.c_gib_s_per_req - dm.c_gib_s_per_req, 6) == round(0.125 / 5, 6)
    assert om.p95_ttft_s == dm.p95_ttft_s == 0.77


def test_a_workload_whose_fixed_point_does_not_converge_is_reported_as_such():
    # Found by a random sweep with a tight budget (5 GiB: not ample capacity): three
    # one-token requests on document d1 retrieved together, one taking the ordinary path,
    # contention 0.173. The replays alternate between two plans whose retrieval instants
    # differ by 37 µs; the last replay is the result, flagged, never a limit.
    rows = [  # arrival, chunks (1 GiB each), document, uncached tokens, output tokens
        (0.240240332800647, 4, "d1", 58, 1),
        (0.4449981977755951, 3, "d1", 29, 1),
        (0.5932968796831136, 3, "d1", 40, 1),
        (0.987917876472564, 3, "d0", 20, 10),
        (1.3216273609266445, 1, "d3", 59, 10),
        (1.635001737609366, 3, "d1", 40, 6),
    ]
    reqs = []
    for i, (t, chunks, doc, uncached, out) in enumerate(rows):
        manifest = prefix_manifest(doc, 256 * chunks, 256, GIB // 256)
        reqs.append(
            Request(f"r{i}", t, t, doc, 256 * chunks + uncached, 256 * chunks, out, manifest)
        )
    limits = EngineLimits(3, sync_loads=True, release_at_first_step=True)
    device = DeviceConfig(8 * GIB, 0.173, 1, 16 * GIB, 12 * GIB, 5 * GIB)
    control = ControlConfig(tick_s=0.05, output_limit_tokens=12, output_prior_tokens=(12,))
    model = ModelProfile("flat+", GIB // 256, CostModel(0.01, 1e-5, 0.0, 0.0))  # 10 µs/token
    m = simulate_oracle(reqs, model, device, limits, control).measures()
    assert (m.oracle_converged, m.oracle_iterations) == (False, MAX_ITERATIONS)
    assert m.oracle_moved_s == pytest.approx(3.724e-5, rel=1e-3)


FIG4_CELLS = [(m, r) for m in ("llama-3.1-8b", "qwen2.5-14b") for r in (0.5, 0.75, 1.0)]
# C as a multiple of Demand's, measured: at 100% the retrievals of Immediate's timeline
# come closer together than their staging, so the oracle stages some claims early.
FIG4_C_OVER_DEMAND = {
    ("llama-3.1-8b", 0.5): 1.0,
    ("llama-3.1-8b", 0.75): 0.971,
    ("llama-3.1-8b", 1.0): 1.045,
    ("qwen2.5-14b", 0.5): 1.0,
    ("qwen2.5-14b", 0.75): 0.974,
    ("qwen2.5-14b", 1.0): 1.068,
}


@pytest.mark.parametrize(("model_name", "ratio"), FIG4_CELLS)
def test_on_figure_4_the_oracle_is_the_limit_in_every_cell(model_name, ratio):
    spec, _ = load(LADDERS / "tempokv-fig4.yaml")
    model = make_profile(model_name)

    def run(policy: str) -> SimMeasures:
        return simulate_policy(spec, model, ratio, 100.0, policy, keep_trace=False).measures()

    o, imm, dem = run("oracle"), run("immediate"), run("demand")
    assert (o.oracle_converged, o.oracle_iterations) == (True, 1)
    assert o.p95_ttft_s <= 1.02 * imm.p95_ttft_s
    assert o.p95_ttft_s == pytest.approx(imm.p95_ttft_s, rel=1e-9)
    # C: Demand's within 2% once the early byte-time serialised staging forces is taken out
    early = o.oracle_early_gib_s_per_req
    assert o.c_gib_s_per_req - early <= 1.02 * dem.c_gib_s_per_req
    ratio_c = o.c_gib_s_per_req / dem.c_gib_s_per_req
    assert ratio_c == pytest.approx(FIG4_C_OVER_DEMAND[(model_name, ratio)], abs=5e-4)
    assert (early == 0) == (ratio == 0.5)
