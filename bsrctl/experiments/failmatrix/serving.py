"""One serving cell of the failure matrix, on the shared deployment (``failmatrix.rig``).

Each cell seeds its own fresh prompt (so no cell sees another's state) and verifies that the
tiers it relies on hold all of it, makes LMCache's L1 and vLLM's local cache forget it,
isolates the source tier, injects its fault by real means (``failmatrix.injectors``), sends
the request, sends a follow-up, recovers, and records one evidence point with the named
checks of ``failmatrix.checks``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bsrctl.evidence import Point
from bsrctl.evidence.verdict import check
from bsrctl.experiments.failmatrix.checks import Observation, serving_checks
from bsrctl.experiments.failmatrix.injectors import ATTACH_COMMANDS, INJECTORS, L1Exhausted
from bsrctl.experiments.failmatrix.rig import Rig
from bsrctl.experiments.failmatrix.spec import CellSpec
from bsrctl.prompts import expected_external_tokens, tokens_sha256

L1_FULL_FRACTION = 0.9  # l1_exhausted: L1 counts as exhausted at this usage while held


def relied_tiers(cell: CellSpec) -> tuple[str, ...]:
    """The tiers whose holding the whole seeded prefix the cell's outcome depends on."""
    fs = cell.source in ("fs", "all") or cell.fault == "mooncake_and_fs_absent"
    moon = cell.source in ("mooncake", "all")
    return tuple(t for t, on in (("fs", fs), ("mooncake", moon)) if on)


class ServingRig(Rig):
    """The shared deployment, and what each serving cell does on it."""

    def run_cell(self, cell: CellSpec, after_seed: Callable[[], None] | None = None) -> Point:
        """`after_seed` runs once the tiers are seeded, before the fault is placed (the tests
        switch a broken restore on there: seeding needs the real one, e.g. ghost hits would
        keep the tiers from being seeded)."""
        t_cell = time.monotonic()
        st, wl = self.stack, self.spec.workload
        ids = self.prompt(cell.id)
        missing = self.missing_commands(cell)
        if missing:  # an attached deployment: bsrctl kills or restarts nothing by itself
            return self._unrunnable(cell, t_cell, missing)
        self.ensure_up()
        inj = INJECTORS[cell.fault](st, cell, ids, self.spec.settings())
        flood: list[dict[str, Any]] = []
        if isinstance(inj, L1Exhausted):
            inj.flood_prompts = [
                self.prompt(f"{cell.id}/flood{i}", wl.flood_prompt_tokens)
                for i in range(wl.flood_requests)
            ]
            flood = [self.seed(p, ("fs",)) for p in inj.flood_prompts]
        seed = self.seed(ids, relied_tiers(cell))
        short = [s["reason"] for s in [*flood, seed] if not s["complete"]]
        if short:  # never inject a fault over a prefix the tiers do not hold
            return self._unseeded(cell, t_cell, seed, flood, "; ".join(short))
        if after_seed is not None:
            after_seed()
        inj.isolate()
        inj.arm()
        lower_prefix = self.fs_prefix_tokens(ids)  # at request time, for the evidence
        full = expected_external_tokens(wl.prompt_tokens, self.spec.stack.lmcache.chunk_size)
        before = self.snapshot()
        wall0, t0 = time.time(), time.monotonic()
        pending = _Request(lambda: st.complete(ids, wl.max_tokens))
        strike_error = ""
        try:
            inj.strike()
        except Exception as exc:  # the fault could not be placed: reported, not raised
            strike_error = f"{type(exc).__name__}: {exc}"
        remaining = max(1.0, cell.bound_s - (time.monotonic() - t_cell))
        comp, err, finished = pending.wait(remaining)
        request_s = (time.monotonic() - t0) if finished else None
        server_killed = cell.fault == "lmcache_killed"
        if server_killed:
            inj.recover()
            self.reconnect()
        after = self.snapshot()
        if not server_killed:
            inj.recover()
        inj.unisolate()
        health_ok, health_detail = self.follow_up()
        markers_left = self.markers_active()
        leaked, alive = self.audit(inj.stopped_pids)
        out_sha = tokens_sha256(comp.output_token_ids) if comp is not None else ""
        outcomes = self.new_outcomes(before, after)
        obs = Observation(
            expect=cell.expect,
            full_prefix_tokens=full,
            cached_tokens=comp.cached_tokens if comp is not None else None,
            request_error="" if err is None else f"{type(err).__name__}: {err}"[:400],
            request_finished=finished,
            output_sha256=out_sha,
            canonical_sha256=tokens_sha256(self.canonical[cell.id]),
            failed_outcomes=[o for o in outcomes if not o.get("ok")],
            ok_outcomes=[o for o in outcomes if o.get("ok")],
            recovered_delta=None
            if after["recovered"] is None or before["recovered"] is None
            else after["recovered"] - before["recovered"],
            lower_tier_reads=after["reads"].get("fs", 0) - before["reads"].get("fs", 0),
            lower_tier_prefix_tokens=lower_prefix,
            marker_events=[e for e in after["markers"] if e.get("t", 0) >= wall0 - 1.0],
            markers_active_after=markers_left,
            lookups_delta=_delta(before["counters"], after["counters"], "lookup"),
            requests_sent=1,  # the L1 flood is warm prefetches: no engine lookup
            server_restarted=server_killed,
            health_ok=health_ok,
            health_detail=health_detail,
            request_s=request_s,
            cell_s=time.monotonic() - t_cell,
            bound_s=cell.bound_s,
            leaked_pids=leaked,
            parts_alive=alive,
            damage=self.damage(cell, inj, before, after),
        )
        checks = serving_checks(obs)
        if strike_error:
            checks.append(check("fault_injected", None, f"strike failed: {strike_error}"))
        l1 = inj.notes.get("flood", {})
        if isinstance(inj, L1Exhausted) and not strike_error:
            used, cap = l1.get("l1_used_max_bytes_while_held", 0), l1.get("l1_capacity_bytes", 0)
            full_l1 = cap > 0 and used >= L1_FULL_FRACTION * cap
            checks.append(
                check(
                    "fault_injected",
                    True if full_l1 else None,
                    f"L1 used at most {used} of {cap} bytes while window {cell.window} was "
                    f"held ({'exhausted' if full_l1 else 'NOT exhausted: fault not placed'}; "
                    f"threshold {L1_FULL_FRACTION:.0%})",
                )
            )
        return Point(
            id=cell.id,
            params=cell.model_dump(),
            measures={
                "tokens": wl.prompt_tokens,
                "window_chunks": wl.window_chunks,
                "cached_tokens": obs.cached_tokens,
                "expected_cached_tokens": full if cell.expect == "lower_tier" else 0,
                "lower_tier_prefix_tokens_at_request": lower_prefix,
                "l1_used_max_bytes_at_fault": l1.get("l1_used_max_bytes_while_held"),
                "l1_capacity_bytes": l1.get("l1_capacity_bytes"),
                "time_to_fallback_s": None if request_s is None else round(request_s, 3),
                "cell_s": round(obs.cell_s, 3),
                "output_sha256": out_sha,
                "canonical_sha256": obs.canonical_sha256,
                "restore_outcomes": obs.failed_outcomes + obs.ok_outcomes,
                "recovered_delta": obs.recovered_delta,
                "lookups_delta": obs.lookups_delta,
                "request_error": obs.request_error,
                "seed": seed,
                **({"flood_seeds": flood} if flood else {}),
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

    def _unknown(self, cell: CellSpec, t_cell: float, name: str, why: str, **extra: Any) -> Point:
        """A cell that could not run as specified: one UNKNOWN check, never PASS."""
        wl = self.spec.workload
        return Point(
            id=cell.id,
            params=cell.model_dump(),
            measures={
                "tokens": wl.prompt_tokens,
                "window_chunks": wl.window_chunks,
                "cached_tokens": None,
                "expected_cached_tokens": None,
                "time_to_fallback_s": None,
                "cell_s": round(time.monotonic() - t_cell, 3),
                **extra,
            },
            checks=(check(name, None, why),),
        )

    def _unrunnable(self, cell: CellSpec, t_cell: float, why: str) -> Point:
        """A cell an attached deployment cannot run: UNKNOWN naming what is missing."""
        return self._unknown(cell, t_cell, "operator_command", why)

    def _unseeded(
        self,
        cell: CellSpec,
        t_cell: float,
        seed: dict[str, Any],
        flood: list[dict[str, Any]],
        reason: str,
    ) -> Point:
        """A cell whose setup could not reach the seeded state: UNKNOWN, never PASS."""
        extra = {"seed": seed, **({"flood_seeds": flood} if flood else {})}
        return self._unknown(cell, t_cell, "setup_seeded", reason, **extra)


class _Request:
    """A request running in a thread, started at construction."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._box["result"] = fn()
        except BaseException as exc:  # recorded as the request's explicit error
            self._box["error"] = exc

    def wait(self, timeout_s: float) -> tuple[Any, BaseException | None, bool]:
        self._thread.join(timeout_s)
        return self._box.get("result"), self._box.get("error"), not self._thread.is_alive()


def _delta(before: dict[str, int], after: dict[str, int], needle: str) -> dict[str, int]:
    keys = {k for k in {*before, *after} if needle in k}
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in sorted(keys)}
