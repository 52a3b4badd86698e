"""`bsrctl soak SPEC --seed S --duration D`: a seeded nemesis under load on one deployment.

The failure matrix's deployment, seeding and injectors (``failmatrix.rig``,
``failmatrix.injectors``), the schedule of ``soak.schedule``, the checks of
``soak.checker``. The load runs in rounds: L1 and vLLM's local cache forget (so every
request restores from the L2 tier, where the faults are), the fault due by then is armed
(isolated to its tier, as in its cell), ``concurrency`` requests of seeded prefixes go out at
once and are waited on up to their deadline, the fault is recovered (its rules cleared, a
damaged object given its original bytes back), the pool's high-water
mark is sampled. After the last round and the quiesce, nothing may be left. One evidence
point per request (its checks: canonical output, deadline), the schedule and every
violation, with its request and fault, in the summary.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bsrctl.errors import BadInput
from bsrctl.evidence import EvidenceWriter, Point, Verdict
from bsrctl.evidence.guards import with_guards
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.failmatrix.background import Background
from bsrctl.experiments.failmatrix.injectors import (
    INJECTORS,
    Injector,
    LmcacheKilled,
    clear_rules,
)
from bsrctl.experiments.failmatrix.rig import FORGET_WAIT_S, HEALTH_TOKENS, Rig
from bsrctl.experiments.run import execute, progress
from bsrctl.experiments.soak.checker import (
    Sent,
    Violation,
    pool_violations,
    quiesce_violations,
    request_violations,
    summary_line,
)
from bsrctl.experiments.soak.schedule import Schedule, ScheduledFault, make_schedule
from bsrctl.experiments.soak.spec import SoakSpec, load_soak
from bsrctl.prompts import tokens_sha256
from bsrctl.specs import resolve_registration, stack_selection
from bsrctl.stack.contracts.bsr_client import outcomes_since
from bsrctl.stack.contracts.deployment import Deployment
from bsrctl.stack.contracts.guards import LMCACHE, GuardWatch
from bsrctl.stack.launch.extensions import ServerModule
from bsrctl.stack.launch.model import prepare_model
from bsrctl.stack.launch.process import pids_alive
from bsrctl.stack.launch.serving import check_ports
from bsrctl.stack.launch.shm_ledger import SHM
from bsrctl.stack.measure.canonical_outputs import canonical_outputs

Say = Callable[[str], None]


def run_soak(
    spec_path: Path,
    out_dir: Path,
    seed: int,
    duration_s: float,
    quiet: bool = False,
    server_module: ServerModule | None = None,
    deployment: Deployment | None = None,
    after_seed: Callable[[], None] | None = None,
) -> Verdict:
    """``server_module`` replaces the LMCache server module (the tests load a mutant);
    ``deployment`` runs the soak on one already up (the tests share the failure matrix's);
    ``after_seed`` runs once the prefixes are seeded, before the load (the tests switch a
    broken restore on there: seeding needs the real one)."""
    if duration_s <= 0:
        raise BadInput(f"--duration: {duration_s:g} s; give a positive number of seconds, e.g. 180")
    spec, raw = load_soak(spec_path)
    say = progress(quiet)
    cells, prefixes = tuple(c.id for c in spec.cells), len(spec.soak.prefix_tokens)
    schedule = make_schedule(
        seed, duration_s, cells, spec.soak.mean_gap_s, spec.windows(), prefixes
    )
    if deployment is None and spec.stack.kind == "serving":
        check_ports(spec.stack)
    selection = stack_selection(spec, None)
    writer = EvidenceWriter(out_dir, "soak", raw, spec.workload.salt, selection)
    soak = _Soak(spec, schedule, say, after_seed)

    closed: list[bool] = []

    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        soak.rig = Rig(spec.as_matrix(), w.run_dir, say, server_module, deployment)
        soak.prepare(w.run_id, up=deployment is None)
        w.set_stack({**soak.rig.deployment.describe(), **selection})
        summary, checks = soak.run(w)
        if deployment is None:  # ours: stopped by PID here, so the run checks it is all gone
            soak.rig.close()
            closed.append(True)
            checks.append(_nothing_left(soak.rig))
        return summary, checks

    def teardown() -> None:
        if soak.rig is not None and deployment is None and not closed:
            soak.rig.close()

    return execute(writer, body, teardown, say)


class _Soak:
    def __init__(
        self, spec: SoakSpec, schedule: Schedule, say: Say, after_seed: Callable[[], None] | None
    ) -> None:
        self.spec, self.schedule, self.say, self.after_seed = spec, schedule, say, after_seed
        self.rig: Rig | None = None
        self.prompts: list[list[int]] = []
        self.canonical: list[str] = []  # sha256 per prefix
        self.armed: list[dict[str, Any]] = []  # per scheduled fault: when and what was placed
        self.sent: list[Sent] = []
        self.samples: list[tuple[float, int]] = []  # (s from the start, the round's pool peak)
        self.sample_fault: dict[float, int | None] = {}  # the fault placed in that round
        self.t0 = 0.0

    # -- setup --

    def prepare(self, run_id: str, up: bool) -> None:
        """Canonical outputs of the run's own prompts (salted with its run id: a soak on a
        deployment another run used starts from prefixes no earlier fault touched), then
        the deployment up (unless it was given, already up)."""
        rig, spec = self.rig, self.spec
        assert rig is not None
        wl = spec.workload
        rig.vocab = prepare_model(spec.stack.vllm).vocab
        self.prompts = [
            rig.prompt(f"soak/{run_id}/p{i}", n) for i, n in enumerate(spec.soak.prefix_tokens)
        ]
        health = rig.prompt("__health__", HEALTH_TOKENS)
        self.say("canonical outputs on a vLLM with no KV connector")
        outs = canonical_outputs(spec.stack, rig.run_dir, [*self.prompts, health], wl.max_tokens)
        self.canonical = [tokens_sha256(o) for o in outs[:-1]]
        rig.canonical["__health__"] = outs[-1]
        if up:
            self.say("starting the serving stack")
            rig.deployment.up(spec.settings())

    def bound_bytes(self) -> int:
        """B x c + aux: the admission budget's chunks, each c bytes on a rank."""
        st, s = self.spec.stack, self.spec.settings()
        tp = st.vllm.tensor_parallel_size
        reg = resolve_registration("auto", st, tp, st.lmcache.chunk_size, "stack.vllm")
        return s.budget_chunks * reg.bytes_per_chunk + self.spec.soak.aux_bytes

    # -- the soak --

    def run(self, w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        rig = self.rig
        assert rig is not None and rig.client is not None
        seeds = [rig.seed(ids, ("fs",)) for ids in self.prompts]
        short = [s["reason"] for s in seeds if not s["complete"]]
        if short:  # never a soak over prefixes the tier does not hold
            return self._summary(seeds, []), [check("setup_seeded", None, "; ".join(short))]
        if self.after_seed is not None:
            self.after_seed()
        bound = self.bound_bytes()
        rig.client.reset_peak()
        rng = random.Random(f"{self.schedule.seed}/load")  # seeded from a str: stable
        pending = list(self.schedule.faults)
        self.t0 = time.monotonic()
        rnd = 0
        while (now := time.monotonic() - self.t0) < self.schedule.duration_s:
            fault = pending.pop(0) if pending and pending[0].start_s <= now else None
            self._round(w, rnd, fault, rng)
            rnd += 1
        self.say(f"quiesce {self.spec.soak.quiesce_s:g} s")
        time.sleep(self.spec.soak.quiesce_s)
        state = self._state()
        health_ok, health_detail = rig.follow_up()
        violations = [
            *(v for s in self.sent for v in request_violations(
                s, self.canonical[s.prefix], self.spec.soak.request_deadline_s)),
            *pool_violations(self.samples, bound, self.sample_fault.get),
            *quiesce_violations(state),
        ]  # fmt: skip
        placed = sum(1 for a in self.armed if a["placed"])
        completed = sum(1 for s in self.sent if s.answer_s is not None)
        line = summary_line(violations, placed, completed)
        self.say(line)
        checks = [
            check("no_violations", not violations, line),
            check(
                "faults_injected",
                True if placed else None,
                f"{placed} of {len(self.schedule.faults)} scheduled fault(s) placed",
            ),  # fmt: skip
            check("post_request_health", health_ok, health_detail),
        ]
        summary = self._summary(seeds, violations)
        peak = max((p for _, p in self.samples), default=0)
        summary.update(quiesced=state, pool_bound_bytes=bound, line=line, pool_peak_max_bytes=peak)
        return summary, checks

    def _round(self, w: EvidenceWriter, rnd: int, fault: ScheduledFault | None, rng: Any) -> None:
        rig, spec = self.rig, self.spec
        assert rig is not None and rig.client is not None
        watch = GuardWatch()  # the server's guard failures over the round
        watch.start(rig.client)
        clear_rules(rig.stack)
        rig.client.forget(wait_s=FORGET_WAIT_S)
        rig.stack.forget_local()
        inj = self._arm(fault, rnd) if fault is not None else None
        # distinct prefixes in a round: two requests of one prompt at once share vLLM's local
        # blocks, so a restore's failure could not be told from its twin's local hit
        picks = rng.sample(range(len(self.prompts)), spec.soak.concurrency)
        base = len(self.sent)
        before = rig.client.status().recent_outcomes
        started = [(i, p, Background(self._request(p))) for i, p in enumerate(picks)]
        deadline = time.monotonic() + spec.soak.request_deadline_s
        # (the answer, its error, send -> answer: None when nothing came by the deadline)
        got = [(i, p, req, (*req.wait(max(0.0, deadline - time.monotonic()))[:2], req.answer_s))
               for i, p, req in started]  # fmt: skip
        if inj is not None:
            self._recover(inj)
        after = rig.client.status().recent_outcomes
        failed = [o for o in outcomes_since(before, after) if not o.ok]
        restarted = (LMCACHE,) if isinstance(inj, LmcacheKilled) else ()
        guards = watch.end(rig.client, restarted)
        for i, p, req, answer in got:
            sent = self._sent(base + i, rnd, p, req.sent_s, answer, fault, failed)
            self.sent.append(sent)
            w.add_point(with_guards(self._point(sent), guards))
        t = time.monotonic() - self.t0
        # the round's own high-water mark: read and restarted at once (bsr.reset_peak)
        self.samples.append((t, rig.client.reset_peak().before.restore_pool_peak_bytes))
        self.sample_fault[t] = fault.index if inj is not None and fault is not None else None

    def _arm(self, fault: ScheduledFault, rnd: int) -> Injector | None:
        rig = self.rig
        assert rig is not None
        cell = next(c for c in self.spec.cells if c.id == fault.fault)
        cell = cell.model_copy(update={"window": fault.window})
        at = round(time.monotonic() - self.t0, 3)
        record = {**fault.__dict__, "armed_at_s": at, "round": rnd, "placed": False, "error": ""}
        self.armed.append(record)
        inj = INJECTORS[cell.fault](
            rig.stack, cell, self.prompts[fault.prefix], self.spec.settings()
        )
        try:
            inj.isolate()
            inj.arm()
        except Exception as exc:  # e.g. the object to damage not stored again yet
            record["error"] = f"{type(exc).__name__}: {exc}"
            inj.unisolate()
            return None
        record.update(placed=True, notes=inj.notes)
        self.say(f"fault {fault.index}: {cell.id} window {cell.window} prefix {fault.prefix}")
        return inj

    def _recover(self, inj: Injector) -> None:
        inj.recover()  # rules cleared later; a damaged object gets its own bytes back
        inj.unisolate()

    def _request(self, prefix: int) -> Callable[[], Any]:
        rig = self.rig
        assert rig is not None
        ids, n = self.prompts[prefix], self.spec.workload.max_tokens
        return lambda: rig.stack.complete(ids, n)

    def _sent(self, index: int, rnd: int, prefix: int, sent_s: float, got: tuple,
              fault: ScheduledFault | None, failed: list[Any]) -> Sent:  # fmt: skip
        comp, err, answer_s = got
        armed = fault is not None and self.armed and self.armed[-1]["placed"]
        rid = comp.request_id if comp is not None else ""
        mine = [o.failure or "failed" for o in failed if rid and rid in o.request_id]
        return Sent(
            index=index, round=rnd, prefix=prefix, sent_s=round(sent_s - self.t0, 3),
            answer_s=None if answer_s is None else round(answer_s, 3),
            output_sha256=tokens_sha256(comp.output_token_ids) if comp is not None else "",
            cached_tokens=comp.cached_tokens if comp is not None else None,
            error="" if err is None else f"{type(err).__name__}: {err}"[:300],
            fault=fault.index if armed and fault is not None else None,
            request_id=rid, failed_restore=mine[0] if mine else "",
        )  # fmt: skip

    def _point(self, s: Sent) -> Point:
        deadline = self.spec.soak.request_deadline_s
        vs = request_violations(s, self.canonical[s.prefix], deadline)
        kinds = {v.kind: v.detail for v in vs}
        return Point(
            id=f"r{s.index:04d}",
            params={
                "round": s.round,
                "prefix": s.prefix,
                "fault": s.fault,
                "prefix_tokens": self.spec.soak.prefix_tokens[s.prefix],
            },  # fmt: skip
            measures={**s.to_json(), "canonical_sha256": self.canonical[s.prefix]},
            checks=(
                check(
                    "canonical_output",
                    "wrong_output" not in kinds and "error" not in kinds,
                    kinds.get("wrong_output") or kinds.get("error") or "canonical",
                ),
                check(
                    "failed_restore_unused",
                    "fail_open" not in kinds,
                    kinds.get("fail_open") or f"restore: {s.failed_restore or 'ok or none'}",
                ),
                check(
                    "within_deadline",
                    "deadline" not in kinds,
                    kinds.get("deadline", f"answered in {s.answer_s} s"),
                ),
            ),  # fmt: skip
        )

    def _state(self) -> dict[str, Any]:
        rig = self.rig
        assert rig is not None and rig.client is not None
        status, peak = rig.client.status(), rig.client.peak()
        return {
            "markers": status.force_local_markers,
            "budget_in_use_chunks": status.budget_in_use_chunks,
            "pool_level_bytes_by_rank": dict(peak.restore_pool_level_bytes_by_rank),
            "tracked_requests": status.tracked_requests,
        }

    def _summary(self, seeds: list[dict[str, Any]], violations: list[Violation]) -> dict[str, Any]:
        return {
            "seed": self.schedule.seed,
            "duration_s": self.schedule.duration_s,
            "schedule": [f.__dict__ for f in self.schedule.faults],
            "armed": self.armed,
            "faults_injected": sum(1 for a in self.armed if a["placed"]),
            "requests_sent": len(self.sent),
            "requests_completed": sum(1 for s in self.sent if s.answer_s is not None),
            "violations": [v.to_json() for v in violations],
            "pool_samples": self.samples,
            "seeds": seeds,
        }


def _nothing_left(rig: Rig) -> Check:
    """After a launched deployment's stop: no process it started, no /dev/shm segment its
    processes mapped."""
    stack = rig.stack
    pids = [p for part in stack.launched for p in (part.pid, *part.descendants()) if p]
    alive = pids_alive(pids)
    left = sorted(n for n in stack.shm_named if (SHM / n).exists())
    return check("nothing_left", not alive and not left,
                 f"{len(pids)} PID(s) started, alive {alive}; segments left {left}")  # fmt: skip
