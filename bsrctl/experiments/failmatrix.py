"""`bsrctl failmatrix`: a workload x fault matrix proving a failed bounded restore ends
closed, correct and explained (issue 5), the way Jepsen proves a database.

One serving deployment is reused across cells (every fault here is recoverable: what was
stopped is restarted, rules are cleared); each cell seeds its own fresh prompt (so no cell
sees another's state), makes LMCache's L1 and vLLM's local cache forget it, isolates the
source tier, injects its fault by real means (``bsrctl.experiments.faults``), sends the
request, sends a follow-up, recovers, and records one evidence point with the named checks of
``bsrctl.experiments.failmatrix_checks``. Cells marked for the storage stack (one rank's keys
dropped with two TP ranks, which the CPU engine cannot serve cheaply) run in-process
(``bsrctl.experiments.failmatrix_storage``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bsrctl.errors import BadInput, StackFailed
from bsrctl.evidence import EvidenceWriter, Point, Verdict
from bsrctl.evidence.record import load_evidence
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.failmatrix_checks import Observation, render_table, serving_checks, table
from bsrctl.experiments.failmatrix_spec import CellSpec, FailMatrixSpec, load_matrix
from bsrctl.experiments.failmatrix_storage import run_storage_cell
from bsrctl.experiments.faults import INJECTORS, Injector, L1Exhausted, run_bounded
from bsrctl.experiments.run import execute, progress
from bsrctl.lmcache_ext.fault_adapter import write_control_file
from bsrctl.prompts import expected_external_tokens, prompt_ids, tokens_sha256
from bsrctl.settings import RestoreSettings
from bsrctl.stack import tinymodel
from bsrctl.stack.bsr_client import BsrModuleClient
from bsrctl.stack.canonical import canonical_outputs
from bsrctl.stack.extensions import bsr_extensions
from bsrctl.stack.process import pids_alive
from bsrctl.stack.serving import ServingStack, check_ports
from bsrctl.stack.tiers import chunk_hashes_hex, fault_stats, fs_objects, wait_tiers_hold

Say = Callable[[str], None]
MUTANT_MODULE = "bsrctl.lmcache_ext.failmatrix_mutants"
RECOVERED = "Recovered from KV load failure"
HEALTH_TOKENS = 320
SEED_ATTEMPTS = 2  # a cold request, then one retry for the chunks a tier still misses
SEED_WAIT_S = 20.0  # per attempt: how long a tier's write-through may take
L1_FULL_FRACTION = 0.9  # l1_exhausted: L1 counts as exhausted at this usage while held


def relied_tiers(cell: CellSpec) -> tuple[str, ...]:
    """The tiers whose holding the whole seeded prefix the cell's outcome depends on."""
    fs = cell.source in ("fs", "all") or cell.fault == "mooncake_and_fs_absent"
    moon = cell.source in ("mooncake", "all")
    return tuple(t for t, on in (("fs", fs), ("mooncake", moon)) if on)


class FailmatrixStack(ServingStack):
    """The serving stack; with `mutations` set, LMCache loads the TEST-ONLY mutant module."""

    def __init__(
        self,
        spec: Any,
        run_dir: Path,
        mutations: list[str] | None = None,
        restore: RestoreSettings | None = None,
    ) -> None:
        super().__init__(spec, run_dir, bsr_extensions(restore or RestoreSettings()))
        self.mutations = mutations

    def _server_module_arg(self) -> dict[str, Any]:
        arg = super()._server_module_arg()
        if self.mutations is not None:
            arg["module_path"] = MUTANT_MODULE
            arg["config"]["mutations"] = list(self.mutations)
        return arg


def run_failmatrix(spec_path: Path, out_dir: Path, stack: str = "serving", quiet: bool = False):
    """Run every cell of the matrix; one evidence point per cell. Returns the verdict."""
    return run_matrix(spec_path, out_dir, stack, progress(quiet))


def run_matrix(
    spec_path: Path,
    out_dir: Path,
    stack: str,
    say: Say,
    only: list[str] | None = None,
    mutations: list[str] | None = None,
) -> Verdict:
    """`only`: cell ids to run; `mutations`: TEST ONLY, break the restore on purpose."""
    if stack not in ("serving", "storage"):
        raise BadInput(f"--stack: {stack!r} is not one of serving, storage")
    spec, raw = load_matrix(spec_path)
    cells = [c for c in spec.cells if only is None or c.id in only]
    if only is not None and len(cells) != len(set(only)):
        valid = ", ".join(c.id for c in spec.cells)
        raise BadInput(f"unknown cell id(s) in {only}; valid: {valid}")
    skipped = [c.id for c in cells if stack == "storage" and c.stack == "serving"]
    cells = [c for c in cells if c.id not in skipped]
    serving = [c for c in cells if c.stack == "serving"]
    if serving:
        check_ports(spec.stack)
    writer = EvidenceWriter(out_dir, "failmatrix", raw, spec.workload.salt, {"kind": stack})
    rig: ServingRig | None = None

    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        nonlocal rig
        if serving:
            rig = ServingRig(spec, w.run_dir, say, mutations)
            rig.prepare(serving)
            w.set_stack({"kind": "serving", "versions": rig.stack.versions(), **rig.stack.state()})
        for cell in cells:
            say(f"cell {cell.id}: {cell.fault} {cell.at} (expect {cell.expect})")
            if cell.stack == "serving":
                assert rig is not None
                point = rig.run_cell(cell)
            else:
                point = run_storage_cell(spec, cell, w.run_dir, mutations)
            w.add_point(point)
            say(f"  {point.verdict}: fallback in {point.measures.get('time_to_fallback_s')} s")
        return _summary(w.points, skipped, mutations), []

    def teardown() -> None:
        if rig is not None:
            rig.close()

    try:
        return execute(writer, body, teardown, say)
    finally:
        (writer.run_dir / "summary.md").write_text(render_table(load_evidence(writer.path)))


def _summary(points: list[dict[str, Any]], skipped: list[str], mutations: Any) -> dict[str, Any]:
    return {
        "table": table(points),
        "time_to_fallback_s": {p["id"]: p["measures"].get("time_to_fallback_s") for p in points},
        "skipped_cells": skipped,
        **({"mutations_test_only": mutations} if mutations is not None else {}),
    }


# ---- the serving rig --------------------------------------------------------------------


class ServingRig:
    """One deployment shared by the serving cells, and what each cell does on it."""

    def __init__(
        self, spec: FailMatrixSpec, run_dir: Path, say: Say, mutations: list[str] | None
    ) -> None:
        self.spec = spec
        self.say = say
        self.run_dir = run_dir
        self.stack = FailmatrixStack(spec.stack, run_dir, mutations, spec.settings())
        self.client: BsrModuleClient | None = None
        self.canonical: dict[str, tuple[int, ...]] = {}
        self.vocab = 0

    # -- lifecycle --

    def prepare(self, cells: list[CellSpec]) -> None:
        wl = self.spec.workload
        model = tinymodel.build() if self.spec.stack.vllm.model == "tiny" else None
        self.vocab = tinymodel.vocab_size(model or Path(self.spec.stack.vllm.model))
        prompts = {c.id: self.prompt(c.id) for c in cells}
        prompts["__health__"] = self.prompt("__health__", HEALTH_TOKENS)
        self.say("canonical outputs on a vLLM with no KV connector")
        outs = canonical_outputs(
            self.spec.stack, self.run_dir, list(prompts.values()), wl.max_tokens
        )
        self.canonical = dict(zip(prompts, outs, strict=True))
        self.say("starting the serving stack")
        self.stack.up()
        self.client = BsrModuleClient(self.stack, timeout_s=30.0)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.stack.down()

    def prompt(self, name: str, tokens: int | None = None) -> list[int]:
        wl = self.spec.workload
        return prompt_ids(f"{wl.salt}/{name}", tokens or wl.prompt_tokens, self.vocab)

    def set_mutations(self, mutations: list[str]) -> None:
        """TEST ONLY: switch the mutant module's mutations (also for restarted servers)."""
        if self.stack.mutations is None:
            raise BadInput("this rig runs the real server module: no mutations to switch")
        assert self.client is not None
        out = self.client.call("bsr.mutation", {"mutations": list(mutations)})
        if not out.get("ok"):
            raise BadInput(f"bsr.mutation refused: {out.get('error')}")
        self.stack.mutations = list(mutations)

    def reconnect(self) -> BsrModuleClient:
        if self.client is not None:
            self.client.close()
        self.client = BsrModuleClient(self.stack, timeout_s=30.0)
        return self.client

    # -- one cell --

    def run_cell(self, cell: CellSpec, mutations: list[str] | None = None) -> Point:
        """`mutations` (TEST ONLY): switched on after the setup, which always seeds with the
        real restore (a broken one, e.g. ghost hits, would keep the tiers from being seeded)."""
        t_cell = time.monotonic()
        st, wl = self.stack, self.spec.workload
        ids = self.prompt(cell.id)
        launched_before = {p.pid for p in st.launched}
        self.ensure_up()
        inj = INJECTORS[cell.fault](st, cell, ids, self.say)
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
        if mutations is not None:
            self.set_mutations(mutations)
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
        markers_left = self._markers_active()
        leaked, alive = self.audit(launched_before, inj.stopped_pids)
        out_sha = tokens_sha256(comp.output_token_ids) if comp is not None else ""
        obs = Observation(
            expect=cell.expect,
            full_prefix_tokens=full,
            cached_tokens=comp.cached_tokens if comp is not None else None,
            request_error="" if err is None else f"{type(err).__name__}: {err}"[:400],
            request_finished=finished,
            output_sha256=out_sha,
            canonical_sha256=tokens_sha256(self.canonical[cell.id]),
            failed_outcomes=[o for o in self._new_outcomes(before, after) if not o.get("ok")],
            ok_outcomes=[o for o in self._new_outcomes(before, after) if o.get("ok")],
            recovered_delta=after["recovered"] - before["recovered"],
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
            damage=self._damage(cell, inj, before, after),
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
                "window_chunks": self.spec.workload.window_chunks,
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

    # -- steps --

    def ensure_up(self) -> None:
        """Restart a part a previous cell left down (bounded by the stack's own waits)."""
        st = self.stack
        for name in ("lmcache", "vllm"):
            part = st.parts.get(name)
            if part is None or not part.alive():
                self.say(f"  restarting {name} (left down)")
                if part is not None:
                    part.stop()
                st.parts.pop(name, None)
                (st.start_lmcache if name == "lmcache" else st.start_vllm)()
                if name == "lmcache":
                    self.reconnect()
        st._save_state()  # noqa: SLF001

    def seed(self, ids: list[int], tiers: tuple[str, ...]) -> dict[str, Any]:
        """Store the prompt's prefix and VERIFY that every tier in `tiers` holds all of it,
        then make L1 and vLLM forget it. `complete` False (with the reason) if a tier still
        misses chunks after SEED_ATTEMPTS cold requests.

        L1 is emptied first: LMCache allocates L1 without evicting (its eviction loop runs
        once a second above an 80% watermark), so a store into an L1 a previous cell left
        full loses whole batches, which then never reach L2."""
        st, lm = self.stack, self.spec.stack.lmcache
        assert self.client is not None
        t0 = time.monotonic()
        n = len(ids) // lm.chunk_size
        held: dict[str, int] = {}
        attempts: list[dict[str, Any]] = []
        for _ in range(SEED_ATTEMPTS):
            for tier in ("fs", "mooncake"):  # no rule left armed by an earlier cell
                write_control_file(st.fault_control(tier), [])
            before = self.client.forget(wait_s=3.0).get("l1_used_bytes_after")
            st.forget_local()
            comp = st.complete(ids, self.spec.workload.max_tokens)
            held = {"fs": 0, "mooncake": 0}
            held.update(wait_tiers_hold(st, ids, lm.chunk_size, tiers, SEED_WAIT_S))
            attempts.append({"l1_used_before": before, "cached_tokens": comp.cached_tokens, **held})
            if all(held[t] == n for t in tiers):
                break
        forgot = self.client.forget(wait_s=3.0)
        st.forget_local()
        short = {t: held[t] for t in tiers if held[t] != n}
        return {
            "complete": not short,
            "reason": ""
            if not short
            else f"setup: after {len(attempts)} seeding attempt(s) tier(s) hold "
            + ", ".join(f"{t} {c}/{n} chunks" for t, c in short.items())
            + " of the seeded prefix: the fault was not injected",
            "tiers": list(tiers),
            "chunks": n,
            "held_chunks": held,
            "attempts": attempts,
            "seed_s": round(time.monotonic() - t0, 3),
            "l1_used_after_forget": forgot.get("l1_used_bytes_after"),
        }

    def _unseeded(
        self,
        cell: CellSpec,
        t_cell: float,
        seed: dict[str, Any],
        flood: list[dict[str, Any]],
        reason: str,
    ) -> Point:
        """A cell whose setup could not reach the seeded state: UNKNOWN, never PASS."""
        wl = self.spec.workload
        return Point(
            id=cell.id,
            params=cell.model_dump(),
            measures={
                "tokens": wl.prompt_tokens,
                "window_chunks": self.spec.workload.window_chunks,
                "cached_tokens": None,
                "expected_cached_tokens": None,
                "time_to_fallback_s": None,
                "cell_s": round(time.monotonic() - t_cell, 3),
                "seed": seed,
                **({"flood_seeds": flood} if flood else {}),
            },
            checks=(check("setup_seeded", None, reason),),
        )

    def fs_prefix_tokens(self, ids: list[int]) -> int:
        """Tokens of the contiguous prefix the FS L2 holds now (capped like vLLM's hit)."""
        lm = self.spec.stack.lmcache
        if not lm.fs_l2:
            return 0
        n = 0
        for h in chunk_hashes_hex(ids, lm.chunk_size, len(ids) // lm.chunk_size):
            if not fs_objects(self.stack, h):
                break
            n += 1
        return min(n * lm.chunk_size, len(ids) - 1)

    def snapshot(self) -> dict[str, Any]:
        assert self.client is not None
        out: dict[str, Any] = {"recovered": self._recovered()}
        try:
            status = self.client.status()
            out["counters"] = status.get("counters", {})
            out["outcomes"] = status.get("recent_outcomes", [])
            out["markers"] = self.client.call("bsr.markers").get("events", [])
            out["reads"] = self.stack.tier_reads()
            out["fs"] = fault_stats(self.stack, "fs").get("inner", {})
        except (StackFailed, OSError) as exc:
            out.update(counters={}, outcomes=[], markers=[], reads={}, fs={}, error=str(exc))
        return out

    def _recovered(self) -> int:
        part = self.stack.parts.get("vllm")
        log = part.log_path if part else self.stack.dir / "vllm.log"
        try:
            return log.read_text(errors="replace").count(RECOVERED)
        except OSError:
            return 0

    @staticmethod
    def _new_outcomes(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
        seen = {(o.get("request_id"), o.get("rank")) for o in before["outcomes"]}
        return [o for o in after["outcomes"] if (o.get("request_id"), o.get("rank")) not in seen]

    def _markers_active(self) -> int | None:
        try:
            assert self.client is not None
            return int(self.client.call("bsr.markers").get("active", -1))
        except (StackFailed, OSError):
            return None

    def _damage(
        self, cell: CellSpec, inj: Injector, before: dict[str, Any], after: dict[str, Any]
    ) -> dict[str, Any]:
        if not cell.fault.startswith("object_"):
            return {}
        counter = "checksum_mismatch" if cell.fault == "object_corrupted" else "size_mismatch"
        moved = int(after["fs"].get(counter, 0)) - int(before["fs"].get(counter, 0))
        return {"counter": counter, "counter_delta": moved, "window": cell.window,
                **inj.notes.get("object", {})}  # fmt: skip

    def follow_up(self) -> tuple[bool, str]:
        """Post-request health: a follow-up request answers, every part is healthy."""
        st = self.stack
        try:
            comp = st.complete(
                self.prompt("__health__", HEALTH_TOKENS), self.spec.workload.max_tokens
            )
        except StackFailed as exc:
            return False, f"follow-up request failed: {exc}"
        canon = self.canonical["__health__"]
        same = comp.output_token_ids == canon
        health = st.health()
        bad = [n for n, h in health.items() if not h.get("healthy")]
        ok = same and not bad
        return ok, (
            f"follow-up answered {len(comp.output_token_ids)} tokens "
            f"({'canonical' if same else 'NOT canonical'}) in {comp.ttft_s:.2f} s; "
            f"unhealthy parts {bad}"
        )

    def audit(self, launched_before: set[int | None], stopped: list[int]) -> tuple[list[int], dict]:
        """Stopped and replaced PIDs are gone; every current part is alive."""
        st = self.stack
        current = set(st.all_pids())
        if st.mooncake is not None:
            current |= {p for p in st.mooncake.pids().values() if p}
        replaced = [p.pid for p in st.launched if p.pid and p.pid not in current]
        gone_expected = sorted({*stopped, *replaced} - current)
        alive = {n: p.alive() for n, p in st.parts.items()}
        if st.mooncake is not None:
            alive |= {
                "mooncake-master": st.mooncake.master.alive(),
                "mooncake-node": st.mooncake.node.alive(),
            }
        return pids_alive(gone_expected), alive


class _Request:
    """A request running in a thread, started at construction."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        import threading

        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._box["result"] = fn()
        except BaseException as exc:  # recorded as the request's explicit error
            self._box["error"] = exc

    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout_s: float) -> tuple[Any, BaseException | None, bool]:
        self._thread.join(timeout_s)
        return self._box.get("result"), self._box.get("error"), not self._thread.is_alive()


def _delta(before: dict[str, int], after: dict[str, int], needle: str) -> dict[str, int]:
    keys = {k for k in {*before, *after} if needle in k}
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in sorted(keys)}


__all__ = ["run_bounded", "run_failmatrix", "run_matrix"]
