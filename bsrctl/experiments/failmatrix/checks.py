"""The failure matrix's checks, as pure functions over what a cell recorded, and its table
(cell -> check -> verdict, kept in the evidence; ``bsrctl.report.failmatrix`` renders it).

Each serving cell records an `Observation` (measured before, during and after the request);
`serving_checks` turns it into the named checks of the issue. Keeping them pure makes them
testable over recorded values, including deliberately broken ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bsrctl.evidence.verdict import Check, check
from bsrctl.stack.launch.serving.client import NOT_REPORTED


@dataclass
class Observation:
    """What one serving cell measured (fields named with units)."""

    expect: str  # lower_tier | recompute | closed
    full_prefix_tokens: int  # what a full restore exposes
    cached_tokens: int | None  # vLLM's usage.cached_tokens (None: no answer)
    request_error: str  # "" or why the request failed (explicit error)
    request_finished: bool  # the request returned (answer or error) within the bound
    output_sha256: str  # of the answer's token ids ("" without an answer)
    canonical_sha256: str  # of the connector-less vLLM's answer
    failed_outcomes: list[dict[str, Any]]  # the module's restore outcomes with ok = False
    ok_outcomes: list[dict[str, Any]]  # the module's restore outcomes with ok = True
    # vLLM's log lines "Recovered from KV load failure" during the request; None: no log
    # to read (an attached deployment whose spec gives no vllm_log)
    recovered_delta: int | None
    lower_tier_reads: int  # keys the lower tier served (lower_tier cells)
    lower_tier_prefix_tokens: int  # the lower tier's contiguous prefix at request time (evidence)
    marker_events: list[dict[str, Any]]  # bsr.markers events during the request
    markers_active_after: int | None  # force-local markers left after the follow-up
    lookups_delta: dict[str, int]  # lookup counters moved during the request
    requests_sent: int  # requests that could look up during the request (1 + other traffic)
    server_restarted: bool  # the LMCache server was killed (markers died with it)
    health_ok: bool  # a follow-up request answered, every part healthy
    health_detail: str
    request_s: float | None  # send -> answer: the time to the fallback result
    cell_s: float  # whole cell, seed and recovery included
    bound_s: float
    leaked_pids: list[int]  # processes stopped or replaced that are still alive
    parts_alive: dict[str, bool]  # every current part of the stack
    damage: dict[str, Any] = field(default_factory=dict)  # object_* cells: counters, window
    fault: str = ""  # the cell's fault (the checks only some faults have)
    window: int = 0  # k: the window the fault strikes
    follow_on: list[Check] = field(default_factory=list)  # failmatrix.scenarios' checks


def _unreported(o: Observation) -> bool:
    """vLLM answered but reported no cached-token count: missing evidence (UNKNOWN)."""
    return o.cached_tokens is None and not o.request_error and bool(o.output_sha256)


def cached_check(o: Observation) -> Check:
    name = "cached_prefix_all_or_nothing"
    full = o.full_prefix_tokens
    if _unreported(o):
        return check(name, None, f"not measured: {NOT_REPORTED}")
    if o.cached_tokens is None:
        ok = o.expect == "closed" and bool(o.request_error) and o.request_finished
        why = f"no answer ({o.request_error or 'request did not return'})"
        return check(name, ok, why + ("; an explicit error is a closed outcome" if ok else ""))
    c = o.cached_tokens
    if o.expect == "lower_tier":
        # setup verified that the lower tier held the whole prefix: it must serve all of it
        ok = c == full and o.lower_tier_reads > 0 and not o.failed_outcomes
        return check(
            name,
            ok,
            f"cached {c}, expected the lower tier's full prefix {full} (it held "
            f"{o.lower_tier_prefix_tokens} at request time); it served "
            f"{o.lower_tier_reads} keys; {len(o.failed_outcomes)} failed restore(s)",
        )
    allowed = (0,) if o.expect == "recompute" else (0, full)
    kind = "partial prefix exposed" if 0 < c < full else f"expected {allowed}"
    return check(
        name, c in allowed, f"cached {c} (full {full}); {kind if c not in allowed else 'ok'}"
    )


def invalidation_check(o: Observation) -> Check:
    name = "no_valid_block_after_failure"
    if not o.failed_outcomes:
        if o.server_restarted:
            if _unreported(o):
                return check(name, None, f"server killed; cached tokens: {NOT_REPORTED}")
            return check(
                name,
                o.cached_tokens in (0, None),
                f"server killed: no outcome survives; vLLM cached {o.cached_tokens}",
            )
        return check(name, True, f"no failed restore ({len(o.ok_outcomes)} committed)")
    f = o.failed_outcomes[0]
    what = f"restore failed {f.get('failure')}: {f.get('detail')}"
    if o.recovered_delta is None:
        return check(
            name,
            None,
            f"{what}; vLLM's recoveries unread: no vLLM log on this host (give "
            "stack.attach.vllm_log)",
        )
    if _unreported(o):
        return check(name, None, f"{what}; cached tokens not measured: {NOT_REPORTED}")
    ok = o.recovered_delta >= 1 and o.cached_tokens in (0, None)
    how = (
        "vLLM reported every block as a load error and recomputed "
        f"(recoveries +{o.recovered_delta})"
        if ok
        else f"but vLLM logged {o.recovered_delta} load-failure recoveries and exposed "
        f"{o.cached_tokens} cached tokens: blocks of the failed restore were used as valid"
    )
    return check(name, ok, f"{what}; {how}")


def canonical_check(o: Observation) -> Check:
    if not o.output_sha256:
        return check("canonical_output", None, f"no output to compare ({o.request_error})")
    ok = o.output_sha256 == o.canonical_sha256
    return check("canonical_output", ok, f"{o.output_sha256[:16]} vs {o.canonical_sha256[:16]}")


def force_local_check(o: Observation) -> Check:
    name = "force_local"
    d = o.lookups_delta
    external = d.get("lookups_probe_only", 0) + d.get("lookups_stock", 0)
    repeated = external - o.requests_sent
    left = o.markers_active_after
    if o.server_restarted:
        return check(
            name,
            left == 0,
            f"server killed (markers torn down with it); {left} active on the restarted server",
        )
    failed_ids = {f.get("request_id") for f in o.failed_outcomes}
    if not failed_ids:
        ok = repeated <= 0 and left == 0
        return check(
            name,
            ok,
            f"no failed restore; external lookups {external} for "
            f"{o.requests_sent} request(s); {left} marker(s) active",
        )
    problems = []
    for rid in sorted(failed_ids):
        seq = [e["event"] for e in o.marker_events if e.get("request_id") == rid]
        if "set" not in seq:
            problems.append(f"{rid}: restore failed but no force-local marker was set")
        elif not any(e.startswith("cleared") for e in seq[seq.index("set") :]):
            problems.append(f"{rid}: marker never cleared (events {seq})")
    if repeated > 0:
        problems.append(
            f"external lookup repeated: {external} external lookups for "
            f"{o.requests_sent} request(s), forced-local {d.get('lookups_forced_local', 0)}"
        )
    if left:
        problems.append(f"{left} marker(s) still active after the follow-up")
    seqs = {
        rid: [e["event"] for e in o.marker_events if e.get("request_id") == rid]
        for rid in failed_ids
    }
    return check(
        name,
        not problems,
        "; ".join(problems)
        or f"marker events {seqs}; "
        f"forced-local lookups {d.get('lookups_forced_local', 0)}; none left",
    )


def damage_check(o: Observation) -> Check | None:
    if not o.damage:
        return None
    dmg = o.damage
    counter, moved = dmg["counter"], dmg["counter_delta"]
    k = dmg["window"]
    at_k = [f for f in o.failed_outcomes if f.get("failure") == "MISSING_KEY"]
    before_install = bool(at_k) and all(int(f.get("windows_done", -1)) <= k for f in at_k)
    ok = moved >= 1 and before_install
    f = at_k[0] if at_k else {}
    return check(
        "corruption_caught_before_install",
        ok,
        f"{dmg.get('file', '?')} ({dmg.get('how', '')}): FS {counter} +{moved}; restore "
        f"{f.get('failure', 'did not fail')} with windows_done={f.get('windows_done')} "
        f"(window {k} never installed), bytes_restored={f.get('bytes_restored')}",
    )


def attempts_check(o: Observation) -> Check | None:
    """load_fails_always: the request ends after exactly one failed restore and none
    committed, so a failing load is not retried into a loop (vLLM #55297; the repeated
    external lookup is ``force_local``'s). slow_tier: that one restore stopped on window k's
    timeout, with k windows done: it never waited on the later slow windows."""
    if o.fault not in ("load_fails_always", "slow_tier"):
        return None
    fails = [
        f"{f.get('failure')} after {f.get('windows_done')} window(s)" for f in o.failed_outcomes
    ]
    one = len(o.failed_outcomes) == 1 and not o.ok_outcomes
    what = f"failed restores {fails or 'none'}, committed {len(o.ok_outcomes)}"
    if o.fault == "load_fails_always":
        return check("one_failed_restore", one, what)
    f = o.failed_outcomes[0] if one else {}
    ok = one and f.get("failure") == "TIMEOUT" and f.get("windows_done") == o.window
    return check(
        "stopped_at_first_slow_window", ok, f"{what}; expected TIMEOUT after {o.window} window(s)"
    )


def serving_checks(o: Observation) -> list[Check]:
    out = [cached_check(o), invalidation_check(o), canonical_check(o), force_local_check(o)]
    for extra in (damage_check(o), attempts_check(o)):
        if extra is not None:
            out.append(extra)
    out.extend(o.follow_on)
    out.append(check("post_request_health", o.health_ok, o.health_detail))
    within = o.request_finished and o.cell_s <= o.bound_s
    req = "none" if o.request_s is None else f"{o.request_s:.2f}"
    out.append(
        check(
            "bounded_time",
            within,
            f"request {req} s, cell {o.cell_s:.1f} s, "
            f"bound {o.bound_s:.0f} s{'' if o.request_finished else ': request hung'}",
        )
    )
    dead = [n for n, a in o.parts_alive.items() if not a]
    out.append(
        check(
            "processes_accounted",
            not o.leaked_pids and not dead,
            f"stopped/replaced PIDs still alive {o.leaked_pids}; parts down {dead}; "
            f"parts {sorted(o.parts_alive)}",
        )
    )
    return out


def table(points: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """cell -> check -> verdict."""
    return {p["id"]: {c["name"]: c["verdict"] for c in p["checks"]} for p in points}
