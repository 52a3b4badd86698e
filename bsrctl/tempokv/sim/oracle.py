"""The oracle's fixed point: replay the seeded run until its retrieval instants stop moving.

The oracle commits each claim just in time for the instant its retrieval begins, but those
instants depend on its own commitments (a late claim stalls the batch and moves every
retrieval after it). So: run Immediate once and take its retrieval instants as the first
plan; run the oracle on the plan; take the retrieval instants it produced as the next plan,
and move a claim earlier by what it was late by where it committed at its planned start
and was still not stage-ready when its retrieval began (a claim the device or the protected
budget held past its start, or one an advance did not make less late, is late for other
reasons and is not moved). Stop when no retrieval instant moves by more than 1 µs and no
claim is late for want of an advance: the plan is then the run's own future. Each replay is
deterministic, so a plan that repeats is a fixed point; one that is not reached within
`MAX_ITERATIONS` replays is reported as such (the last replay is the result, with
`oracle_converged` false and how far its instants still moved), never as a limit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bsrctl.tempokv.oracle import OraclePlan
from bsrctl.tempokv.sim.device import DeviceConfig
from bsrctl.tempokv.sim.models import ModelProfile
from bsrctl.tempokv.sim.run import ControlConfig, SimResult, simulate
from bsrctl.tempokv.sim.workload import Request
from bsrkv.tempokv.kv import GIB
from bsrkv.tempokv.ttu import EngineLimits

MAX_ITERATIONS = 12
MOVE_TOL_S = 1e-6  # retrieval instants this close are the same instant
LATE_TOL_S = 1e-5  # claim traces keep microseconds; later than this is late


def simulate_oracle(
    requests: Sequence[Request],
    model: ModelProfile,
    device_cfg: DeviceConfig,
    limits: EngineLimits,
    control: ControlConfig,
    keep_trace: bool = True,
    max_iterations: int = MAX_ITERATIONS,
) -> SimResult:
    """The oracle's run at its fixed point (or the last replay, flagged)."""
    manifests = {r.req_id: r.manifest for r in requests if r.manifest.objects}
    reported_s = {r.req_id: r.hit_s for r in requests if r.manifest.objects}
    seed = simulate(requests, model, device_cfg, limits, control, "immediate", keep_trace=False)
    retrieval_s = _retrievals(seed)
    advance_s: dict[str, float] = {}
    advanced: dict[str, float] = {}  # claims advanced after the last replay: by how much
    res = seed
    moved_s = float("inf")
    for iteration in range(1, max_iterations + 1):
        plan = OraclePlan(retrieval_s, manifests, reported_s, dict(advance_s))
        res = simulate(
            requests, model, device_cfg, limits, control, "oracle", keep_trace=True, oracle=plan
        )
        now = _retrievals(res)
        moved_s = max((abs(now[c] - retrieval_s.get(c, -1.0)) for c in now), default=0.0)
        # a claim advanced last time and no less late now is not late for want of advance
        late = {
            cid: late_s
            for cid, late_s in _late(res).items()
            if not (cid in advanced and late_s >= advanced[cid] - LATE_TOL_S)
        }
        if moved_s <= MOVE_TOL_S and not late:
            return _noted(res, iteration, True, moved_s, keep_trace)
        for cid, late_s in late.items():
            advance_s[cid] = advance_s.get(cid, 0.0) + late_s
        advanced = late
        retrieval_s = now
    return _noted(res, max_iterations, False, moved_s, keep_trace)


def _retrievals(res: SimResult) -> dict[str, float]:
    return {
        lg.req.req_id: lg.retrieval_s
        for lg in res.logs
        if lg.req.manifest.objects and lg.retrieval_s is not None
    }


def _late(res: SimResult) -> dict[str, float]:
    """Claims committed by plan (after their report, before their retrieval) that were not
    stage-ready when it began: how late. A claim committed at its retrieval was forced
    there (its retrieval came before the plan said; the next plan's instants correct that),
    and one committed on report, or as soon as the device was free, could not have been
    earlier."""
    out = {}
    for lg in res.logs:
        cid = lg.req.req_id
        if lg.path != "committed" or lg.retrieval_s is None or lg.transfer_end_s is None:
            continue
        trace = res.claim_traces[cid]
        committed_s = next(float(t) for t, st in trace if st in ("STAGING", "STAGEREADY"))
        reported_s = float(trace[0][0])
        if (
            committed_s >= lg.retrieval_s - LATE_TOL_S
            or committed_s <= reported_s + LATE_TOL_S
            or cid in res.oracle_delayed
        ):
            continue  # forced by its retrieval, or as soon as it could: not earlier
        ready_s = next(float(t) for t, st in trace if st == "STAGEREADY")
        late_s = ready_s - lg.retrieval_s
        if late_s > LATE_TOL_S:
            out[cid] = late_s
    return out


def _early_byte_s(res: SimResult) -> float:
    """Byte-time claims spent stage-ready before their retrieval began: what the oracle's
    C holds beyond staging, transfer and the first step (its staging is serialised, so a
    claim whose successor must stage right after it is ready early)."""
    total = 0.0
    for lg in res.logs:
        if lg.path != "committed" or lg.retrieval_s is None:
            continue
        trace = res.claim_traces[lg.req.req_id]
        ready_s = next(float(t) for t, st in trace if st == "STAGEREADY")
        if lg.retrieval_s - ready_s > LATE_TOL_S:  # beyond the guard and trace rounding
            total += lg.req.manifest.size_bytes * (lg.retrieval_s - ready_s)
    return total


def _noted(
    res: SimResult, iterations: int, converged: bool, moved_s: float, keep_trace: bool
) -> SimResult:
    notes = {
        "oracle_iterations": iterations,
        "oracle_converged": converged,
        "oracle_moved_s": moved_s,
        "oracle_delayed_claims": len(res.oracle_delayed),
        "oracle_early_gib_s_per_req": _early_byte_s(res) / GIB / max(1, res.measures().completed),
    }
    if keep_trace:
        return replace(res, notes=notes)
    return replace(res, notes=notes, claim_traces={}, p_trace=())
