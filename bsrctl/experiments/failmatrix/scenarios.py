"""The failure cells of more than one request, on the shared deployment.

- ``mooncake_master_restarted`` and ``whole_plan_past_l1`` run the one-request cell of
  ``failmatrix.serving`` (its fault, its request, its checks) and then a follow-on
  (``FOLLOW_ONS``), before the fault is recovered: after the master's restart the prefix is
  stored again and must hit again; after the whole plan's retrieve past L1, BSR (W > 0)
  must restore the same prefix on the same deployment.
- ``concurrent_restores`` (``run_concurrent``) has no fault: ``requests`` prompts of mixed
  sizes are seeded, then restored all at once under the budget B; every output canonical,
  every request its full prefix, the pool's peak over all of them within B x c + aux.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bsrctl.evidence import Point
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.failmatrix.background import Background
from bsrctl.experiments.failmatrix.injectors import INJECTORS, clear_rules
from bsrctl.experiments.failmatrix.not_run import unseeded_point
from bsrctl.experiments.failmatrix.rig import FORGET_WAIT_S, Rig
from bsrctl.experiments.failmatrix.spec import FIELD_REPORTS, CellSpec
from bsrctl.prompts import expected_external_tokens, tokens_sha256
from bsrctl.stack.contracts.bsr_client import outcomes_since


def pool_bound_bytes(rig: Rig, cell: CellSpec) -> int:
    """B x c + aux: the deployment's admission budget, each chunk c bytes on a rank."""
    return rig.spec.settings().budget_chunks * rig.spec.bytes_per_chunk() + cell.aux_bytes


def restore_again(rig: Rig, cell: CellSpec, ids: list[int], name: str, why: str) -> Check:
    """L1 and vLLM's local cache forget; the prompt is sent once more. PASS when it restored
    its full prefix (cached tokens, one committed restore of its own, none failed), its output
    is canonical and the pool's peak stayed within B x c + aux."""
    assert rig.client is not None
    rig.client.forget(wait_s=FORGET_WAIT_S)
    rig.stack.forget_local()
    rig.client.reset_peak()
    full = expected_external_tokens(len(ids), rig.spec.stack.lmcache.chunk_size)
    before = rig.client.status().recent_outcomes
    try:
        comp = rig.stack.complete(ids, rig.spec.workload.max_tokens)
    except Exception as exc:  # an explicit error: this check fails, naming it
        return check(name, False, f"{why}: the request failed: {type(exc).__name__}: {exc}"[:400])
    mine = [o for o in outcomes_since(before, rig.client.status().recent_outcomes)
            if comp.request_id and comp.request_id in o.request_id]  # fmt: skip
    peak = rig.client.reset_peak().before.restore_pool_peak_bytes
    bound = pool_bound_bytes(rig, cell)
    canonical = tokens_sha256(comp.output_token_ids) == tokens_sha256(rig.canonical[cell.id])
    committed = [o for o in mine if o.ok and o.mode == "bsr"]
    ok = (comp.cached_tokens == full and canonical and bool(committed)
          and all(o.ok for o in mine) and peak <= bound)  # fmt: skip
    return check(
        name,
        ok,
        f"{why}: cached {comp.cached_tokens} of {full}; output "
        f"{'canonical' if canonical else 'NOT canonical'}; restores "
        f"{[('ok' if o.ok else o.failure) + '/' + o.mode for o in mine] or 'none'}; pool peak "
        f"{peak} B, bound B x c + aux = {bound} B",
    )


def after_master_restart(rig: Rig, cell: CellSpec, ids: list[int]) -> list[Check]:
    """A new store after the restart, then the prefix must hit again (Mooncake #2254: a
    restarted instance never hits its own KV again)."""
    s = rig.seed(ids, ("mooncake",))
    if not s["complete"]:
        return [
            check("hits_after_new_store", False, f"stored again after the restart: {s['reason']}")
        ]
    return [restore_again(rig, cell, ids, "hits_after_new_store", "stored again after the restart")]


def after_whole_plan(rig: Rig, cell: CellSpec, ids: list[int]) -> list[Check]:
    """The fault was real (the prefix is larger than the live L1), then the same prefix
    with BSR's W back on the same deployment."""
    assert rig.client is not None
    chunks = len(ids) // rig.spec.stack.lmcache.chunk_size
    need, cap = chunks * rig.spec.bytes_per_chunk(), rig.client.peak().l1_capacity_bytes
    why = f"the whole plan is {chunks} chunks = {need} B; L1 holds {cap} B (live)"
    past = check("fault_injected", need > cap, why)
    s = rig.spec.settings()
    rig.deployment.configure(s.window_chunks, s.admission_budget_chunks, s.readback)
    return [
        past,
        restore_again(rig, cell, ids, "bsr_restores_same_prefix", f"W = {s.window_chunks}"),
    ]


LATER_REQUESTS = 3  # storage_node_lost: requests sent while the storage node is gone


def after_storage_node_lost(rig: Rig, cell: CellSpec, ids: list[int]) -> list[Check]:
    """Every later request, with the storage node still gone, completes with the canonical
    output (LMCache #1814: another node's engine crashed on its next request)."""
    assert rig.client is not None
    done = []
    for i in range(LATER_REQUESTS):
        rig.client.forget(wait_s=FORGET_WAIT_S)
        rig.stack.forget_local()
        t0 = time.monotonic()
        try:
            comp = rig.stack.complete(ids, rig.spec.workload.max_tokens)
        except Exception as exc:  # an explicit error: not a completed request
            done.append((i, f"{type(exc).__name__}: {exc}"[:200], None))
            continue
        same = tokens_sha256(comp.output_token_ids) == tokens_sha256(rig.canonical[cell.id])
        done.append((i, "canonical" if same else "NOT canonical", round(time.monotonic() - t0, 2)))
    ok = all(what == "canonical" for _, what, _ in done)
    return [check("later_requests_canonical", ok,
                  f"{LATER_REQUESTS} later requests with the storage node gone: "
                  + "; ".join(f"#{i} {what} in {s} s" for i, what, s in done))]  # fmt: skip


FOLLOW_ONS: dict[str, Callable[[Rig, CellSpec, list[int]], list[Check]]] = {
    "mooncake_master_restarted": after_master_restart,
    "whole_plan_past_l1": after_whole_plan,
    "storage_node_lost": after_storage_node_lost,
}


def run_concurrent(rig: Rig, cell: CellSpec, t_cell: float) -> Point:
    """Seed every prompt into the FS L2, forget L1 and vLLM's local cache, send them all at
    once (Mooncake isolated away, as the cell's source fs says), wait within the bound."""
    assert rig.client is not None
    wl = rig.spec.workload
    prompts = rig.cell_prompts(cell)
    seeds = {name: rig.seed(ids, ("fs",)) for name, ids in prompts.items()}
    short = "; ".join(f"{n}: {s['reason']}" for n, s in seeds.items() if not s["complete"])
    measures: dict[str, Any] = {
        "covers": FIELD_REPORTS[cell.fault],
        "requests": cell.requests,
        "mix_tokens": cell.mix(),
    }
    if short:
        seed = {"complete": False, "prompts": seeds}
        return unseeded_point(rig.spec, cell, t_cell, seed, [], short)
    inj = INJECTORS[cell.fault](rig.stack, cell, [], rig.spec.settings())
    inj.isolate()
    rig.client.forget(wait_s=FORGET_WAIT_S)
    rig.stack.forget_local()
    rig.client.reset_peak()
    before = rig.client.status().recent_outcomes
    t0 = time.monotonic()
    sent = {n: Background(lambda ids=ids: rig.stack.complete(ids, wl.max_tokens))
            for n, ids in prompts.items()}  # fmt: skip
    got = {n: req.wait(max(1.0, cell.bound_s - (time.monotonic() - t_cell)))
           for n, req in sent.items()}  # fmt: skip
    request_s = time.monotonic() - t0
    status = rig.client.status()
    outcomes = outcomes_since(before, status.recent_outcomes)
    peak = rig.client.reset_peak().before
    budget_peak = status.budget_peak_in_use_chunks
    inj.unisolate()
    clear_rules(rig.stack)
    health_ok, health_detail = rig.follow_up()
    leaked, alive = rig.audit([])
    rows = []
    for name, (comp, err, finished) in got.items():
        ids = prompts[name]
        rid = comp.request_id if comp is not None else ""
        mine = [o for o in outcomes if rid and rid in o.request_id]
        rows.append({
            "prompt": name, "tokens": len(ids), "request_id": rid, "finished": finished,
            "error": "" if err is None else f"{type(err).__name__}: {err}"[:300],
            "cached_tokens": comp.cached_tokens if comp is not None else None,
            "full_tokens": expected_external_tokens(len(ids), rig.spec.stack.lmcache.chunk_size),
            "canonical": comp is not None and tokens_sha256(comp.output_token_ids)
            == tokens_sha256(rig.canonical[name]),
            "restores": [o.to_json() for o in mine],
            "answer_s": sent[name].answer_s,
        })  # fmt: skip
    bound = pool_bound_bytes(rig, cell)
    measures.update(
        per_request=rows,
        pool_peak_bytes=peak.restore_pool_peak_bytes,
        pool_peak_bytes_by_rank=dict(peak.restore_pool_peak_bytes_by_rank),
        pool_bound_bytes=bound,
        budget_peak_in_use_chunks=budget_peak,
        l1_used_peak_bytes=peak.l1_used_peak_bytes,
        wall_s=round(request_s, 3),
        cell_s=round(time.monotonic() - t_cell, 3),
        seeds=seeds,
    )
    return Point(
        id=cell.id,
        params=cell.model_dump(),
        measures=measures,
        checks=tuple(
            concurrent_checks(
                rows,
                peak.restore_pool_peak_bytes,
                bound,
                budget_peak,
                rig.spec.settings().budget_chunks,
                health_ok,
                health_detail,
                leaked,
                alive,
                time.monotonic() - t_cell,
                cell.bound_s,
            )
        ),  # fmt: skip
    )


def concurrent_checks(
    rows: list[dict[str, Any]],
    peak: int,
    bound: int,
    budget_peak: int,
    budget: int,
    health_ok: bool,
    health_detail: str,
    leaked: list[int],
    alive: dict[str, bool],
    cell_s: float,
    bound_s: float,
) -> list[Check]:
    """Pure: the concurrent cell's checks over what it recorded, one row per request."""
    n = len(rows)
    unfinished = [r["prompt"] for r in rows if not r["finished"]]
    wrong = [r["prompt"] for r in rows if r["finished"] and not r["canonical"]]
    errors = [f"{r['prompt']}: {r['error']}" for r in rows if r["error"]]
    partial = [
        f"{r['prompt']} cached {r['cached_tokens']} of {r['full_tokens']}"
        for r in rows
        if r["cached_tokens"] != r["full_tokens"]
    ]
    failed = [
        f"{r['prompt']}: {o.get('failure')}" for r in rows for o in r["restores"] if not o["ok"]
    ]
    unrestored = [r["prompt"] for r in rows if not any(o["ok"] for o in r["restores"])]
    dead = [k for k, a in alive.items() if not a]
    return [
        check("all_answered", not unfinished and not errors,
              f"{n - len(unfinished)} of {n} answered within the bound"
              + (f"; hung {unfinished}" if unfinished else "")
              + (f"; errors {errors}" if errors else "")),
        check("canonical_output", not wrong and not unfinished,
              f"{n - len(wrong) - len(unfinished)} of {n} canonical"
              + (f"; wrong {wrong}" if wrong else "")),
        check("every_prefix_restored", not partial and not failed and not unrestored,
              f"{n - len(unrestored)} of {n} restored their full prefix"
              + (f"; not full: {partial}" if partial else "")
              + (f"; failed restores: {failed}" if failed else "")),
        check("pool_bound", peak <= bound and budget_peak <= budget,
              f"pool peak {peak} B over all {n}, bound B x c + aux = {bound} B; budget peak "
              f"{budget_peak} of B = {budget} chunks"),
        check("post_request_health", health_ok, health_detail),
        check("bounded_time", not unfinished and cell_s <= bound_s,
              f"cell {cell_s:.1f} s, bound {bound_s:.0f} s"),
        check("processes_accounted", not leaked and not dead,
              f"stopped/replaced PIDs still alive {leaked}; parts down {dead}"),
    ]  # fmt: skip
