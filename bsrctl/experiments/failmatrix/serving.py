"""One serving cell of the failure matrix, on the shared deployment (``failmatrix.rig``).

Each cell seeds its own fresh prompt (so no cell sees another's state) and verifies that the
tiers it relies on hold all of it, makes LMCache's L1 and vLLM's local cache forget it
(``seed_cell``); isolates the source tier, injects its fault by real means
(``failmatrix.injectors``) and sends the request (``inject_and_request``); recovers, sends a
follow-up and audits the processes (``observe``); and records one evidence point with the
named checks of ``failmatrix.checks`` (``record``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bsrctl.evidence import Point
from bsrctl.evidence.guards import with_guards
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.failmatrix.background import Background
from bsrctl.experiments.failmatrix.checks import Observation, serving_checks
from bsrctl.experiments.failmatrix.injectors import (
    ATTACH_COMMANDS,
    INJECTORS,
    Injector,
    L1Exhausted,
)
from bsrctl.experiments.failmatrix.not_run import unknown_point, unseeded_point
from bsrctl.experiments.failmatrix.rig import Rig
from bsrctl.experiments.failmatrix.scenarios import FOLLOW_ONS, run_concurrent
from bsrctl.experiments.failmatrix.spec import FIELD_REPORTS, CellSpec
from bsrctl.prompts import expected_external_tokens, tokens_sha256
from bsrctl.stack.contracts.guards import LMCACHE, GuardWatch

L1_FULL_FRACTION = 0.9  # l1_exhausted: L1 counts as exhausted at this usage while held


def relied_tiers(cell: CellSpec) -> tuple[str, ...]:
    """The tiers whose holding the whole seeded prefix the cell's outcome depends on."""
    fs = cell.source in ("fs", "all") or cell.fault == "mooncake_and_fs_absent"
    moon = cell.source in ("mooncake", "all")
    return tuple(t for t, on in (("fs", fs), ("mooncake", moon)) if on)


@dataclass(frozen=True)
class Seeded:
    """A cell after seeding: its prompt, its fault (not yet placed) and the seeding records."""

    ids: list[int]
    inj: Injector
    seed: dict[str, Any]  # the cell's prompt (Rig.seed's record)
    flood: list[dict[str, Any]]  # l1_exhausted: the other prompts'

    @property
    def short(self) -> str:
        """Why a tier does not hold a whole seeded prefix ("" when every one does)."""
        return "; ".join(s["reason"] for s in [*self.flood, self.seed] if not s["complete"])


@dataclass(frozen=True)
class Sent:
    """The cell's request, sent with its fault placed: what it returned, and the state
    before it (the snapshot and what the lower tier held)."""

    before: dict[str, Any]  # Rig.snapshot before the request
    wall0: float  # wall time at send (marker events are wall-stamped)
    full: int  # tokens a full restore exposes
    lower_prefix: int  # FS L2's contiguous prefix at request time
    comp: Any  # the completion (None: no answer)
    err: BaseException | None  # the request's explicit error
    finished: bool  # returned (answer or error) within the cell's bound
    request_s: float | None  # send -> answer
    strike_error: str  # the fault could not be placed ("" when it was)


class ServingRig(Rig):
    """The shared deployment, and what each serving cell does on it: seed, inject and
    request, observe, record (one method each)."""

    def run_cell(self, cell: CellSpec, after_seed: Callable[[], None] | None = None) -> Point:
        """`after_seed` runs once the tiers are seeded, before the fault is placed (the tests
        switch a broken restore on there: seeding needs the real one, e.g. ghost hits would
        keep the tiers from being seeded)."""
        t_cell = time.monotonic()
        missing = self.missing_commands(cell)
        if missing:  # an attached deployment: bsrctl kills or restarts nothing by itself
            return unknown_point(self.spec, cell, t_cell, "operator_command", missing)
        self.ensure_up()
        watch = GuardWatch()  # the server's guard failures over the whole cell
        watch.start(self.client)
        point = self._run_cell(cell, t_cell, after_seed)
        restarted = (LMCACHE,) if cell.fault == "lmcache_killed" else ()
        return with_guards(point, watch.end(self.client, restarted))

    def _run_cell(
        self, cell: CellSpec, t_cell: float, after_seed: Callable[[], None] | None
    ) -> Point:
        if cell.fault == "concurrent_restores":
            return run_concurrent(self, cell, t_cell)
        seeded = self.seed_cell(cell)
        if seeded.short:  # never inject a fault over a prefix the tiers do not hold
            return unseeded_point(self.spec, cell, t_cell, seeded.seed, seeded.flood, seeded.short)
        if after_seed is not None:
            after_seed()
        sent = self.inject_and_request(cell, seeded, t_cell)
        obs = self.observe(cell, seeded, sent, t_cell)
        return self.record(cell, seeded, sent, obs)

    def seed_cell(self, cell: CellSpec) -> Seeded:
        """The cell's fault (not placed yet) and its prompt seeded into the tiers it relies
        on; l1_exhausted also seeds the other prompts whose prefetches will fill L1."""
        wl = self.spec.workload
        ids = self.cell_prompts(cell)[cell.id]
        inj = INJECTORS[cell.fault](self.stack, cell, ids, self.spec.settings())
        inj.deployment = self.deployment
        flood: list[dict[str, Any]] = []
        if isinstance(inj, L1Exhausted):
            inj.flood_prompts = [
                self.prompt(f"{cell.id}/flood{i}", wl.flood_prompt_tokens)
                for i in range(wl.flood_requests)
            ]
            flood = [self.seed(p, ("fs",)) for p in inj.flood_prompts]
        return Seeded(ids, inj, self.seed(ids, relied_tiers(cell)), flood)

    def inject_and_request(self, cell: CellSpec, seeded: Seeded, t_cell: float) -> Sent:
        """Isolate the source tier, arm the fault, send the request, strike while it runs,
        and wait for it within what is left of the cell's bound."""
        wl, inj, ids = self.spec.workload, seeded.inj, seeded.ids
        inj.isolate()
        inj.arm()
        lower_prefix = self.fs_prefix_tokens(ids)  # at request time, for the evidence
        full = expected_external_tokens(len(ids), self.spec.stack.lmcache.chunk_size)
        before = self.snapshot()
        wall0, t0 = time.time(), time.monotonic()
        pending = Background(lambda: self.stack.complete(ids, wl.max_tokens))
        strike_error = ""
        try:
            inj.strike()
        except Exception as exc:  # the fault could not be placed: reported, not raised
            strike_error = f"{type(exc).__name__}: {exc}"
        remaining = max(1.0, cell.bound_s - (time.monotonic() - t_cell))
        comp, err, finished = pending.wait(remaining)
        request_s = (time.monotonic() - t0) if finished else None
        return Sent(before, wall0, full, lower_prefix, comp, err, finished, request_s,
                    strike_error)  # fmt: skip

    def observe(self, cell: CellSpec, seeded: Seeded, sent: Sent, t_cell: float) -> Observation:
        """Recover from the fault, then what the cell's checks read: the snapshot after, the
        follow-up request, the markers left, the process audit, the restore outcomes."""
        inj, before, comp, err = seeded.inj, sent.before, sent.comp, sent.err
        server_killed = cell.fault == "lmcache_killed"
        if server_killed:
            inj.recover()
            self.reconnect()
        after = self.snapshot()
        then = FOLLOW_ONS.get(cell.fault)  # before recovery: the fault's state still holds
        follow_on = then(self, cell, seeded.ids) if then is not None and sent.finished else []
        if not server_killed:
            inj.recover()
        inj.unisolate()
        health_ok, health_detail = self.follow_up()
        markers_left = self.markers_active()
        leaked, alive = self.audit(inj.stopped_pids)
        outcomes = self.new_outcomes(before, after)
        return Observation(
            expect=cell.expect,
            full_prefix_tokens=sent.full,
            cached_tokens=comp.cached_tokens if comp is not None else None,
            request_error="" if err is None else f"{type(err).__name__}: {err}"[:400],
            request_finished=sent.finished,
            output_sha256=tokens_sha256(comp.output_token_ids) if comp is not None else "",
            canonical_sha256=tokens_sha256(self.canonical[cell.id]),
            failed_outcomes=[o for o in outcomes if not o.get("ok")],
            ok_outcomes=[o for o in outcomes if o.get("ok")],
            recovered_delta=None
            if after["recovered"] is None or before["recovered"] is None
            else after["recovered"] - before["recovered"],
            lower_tier_reads=after["reads"].get("fs", 0) - before["reads"].get("fs", 0),
            lower_tier_prefix_tokens=sent.lower_prefix,
            marker_events=[e for e in after["markers"] if e.get("t", 0) >= sent.wall0 - 1.0],
            markers_active_after=markers_left,
            lookups_delta=_delta(before["counters"], after["counters"], "lookup"),
            requests_sent=1,  # the L1 flood is warm prefetches: no engine lookup
            server_restarted=server_killed,
            health_ok=health_ok,
            health_detail=health_detail,
            request_s=sent.request_s,
            cell_s=time.monotonic() - t_cell,
            bound_s=cell.bound_s,
            leaked_pids=leaked,
            parts_alive=alive,
            damage=self.damage(cell, inj, before, after),
            fault=cell.fault,
            window=cell.window,
            follow_on=follow_on,
        )

    def record(self, cell: CellSpec, seeded: Seeded, sent: Sent, obs: Observation) -> Point:
        """The cell's evidence point: the named checks over the observation, and whether the
        fault was placed at all."""
        wl, inj = self.spec.workload, seeded.inj
        checks = serving_checks(obs)
        checks.extend(fault_placed_checks(cell, inj, sent.strike_error))
        l1 = inj.notes.get("flood", {})
        return Point(
            id=cell.id,
            params=cell.model_dump(),
            measures={
                "covers": FIELD_REPORTS.get(cell.fault, ""),
                "tokens": len(seeded.ids),
                "window_chunks": wl.window_chunks,
                "cached_tokens": obs.cached_tokens,
                "expected_cached_tokens": sent.full if cell.expect == "lower_tier" else 0,
                "lower_tier_prefix_tokens_at_request": sent.lower_prefix,
                "l1_used_max_bytes_at_fault": l1.get("l1_used_max_bytes_while_held"),
                "l1_capacity_bytes": l1.get("l1_capacity_bytes"),
                "time_to_fallback_s": None if sent.request_s is None else round(sent.request_s, 3),
                "cell_s": round(obs.cell_s, 3),
                "output_sha256": obs.output_sha256,
                "canonical_sha256": obs.canonical_sha256,
                "restore_outcomes": obs.failed_outcomes + obs.ok_outcomes,
                "recovered_delta": obs.recovered_delta,
                "lookups_delta": obs.lookups_delta,
                "request_error": obs.request_error,
                "seed": seeded.seed,
                **({"flood_seeds": seeded.flood} if seeded.flood else {}),
            },
            checks=tuple(checks),
            extra={"fault_notes": inj.notes, "marker_events": obs.marker_events},
        )

    def missing_commands(self, cell: CellSpec) -> str:
        """Why this cell cannot run on an attached deployment ('' when it can)."""
        if not self.attached:
            return ""
        needs = ATTACH_COMMANDS.get(cell.fault, ())
        if needs is None:
            return f"fault {cell.fault} needs a topology bsrctl launched; not on attach"
        lacking = [n for n in needs if not self.stack.has_command(n)]
        if not lacking:
            return ""
        return (
            f"fault {cell.fault} needs the operator's "
            + " and ".join(f"stack.attach.commands.{n}" for n in lacking)
            + " (bsrctl stops or restarts nothing it did not start)"
        )


def fault_placed_checks(cell: CellSpec, inj: Injector, strike_error: str) -> list[Check]:
    """``fault_injected`` when the fault may not have been placed: UNKNOWN when its strike
    failed; l1_exhausted: PASS only if L1 really was full while window k was held."""
    if strike_error:
        return [check("fault_injected", None, f"strike failed: {strike_error}")]
    if not isinstance(inj, L1Exhausted):
        return []
    l1 = inj.notes.get("flood", {})
    used, cap = l1.get("l1_used_max_bytes_while_held", 0), l1.get("l1_capacity_bytes", 0)
    full_l1 = cap > 0 and used >= L1_FULL_FRACTION * cap
    return [
        check(
            "fault_injected",
            True if full_l1 else None,
            f"L1 used at most {used} of {cap} bytes while window {cell.window} was "
            f"held ({'exhausted' if full_l1 else 'NOT exhausted: fault not placed'}; "
            f"threshold {L1_FULL_FRACTION:.0%})",
        )
    ]


def _delta(before: dict[str, int], after: dict[str, int], needle: str) -> dict[str, int]:
    keys = {k for k in {*before, *after} if needle in k}
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in sorted(keys)}
