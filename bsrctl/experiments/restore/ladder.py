"""`bsrctl ladder`: the whole-plan path (W = 0). For each prefix size, raise L1 through the
rungs (a fresh deployment per rung: LMCache relaunched with that L1, and vLLM with it) until
full-prefix reuse passes. On serving, one first deployment (the spec's L1) computes and
stores every prefix; the rungs share its FS L2 and only restore. Recorded per size: first
passing rung, last failing rung, the measured restore-pool (L1) peak of the passing rung,
and where this machine's memory ends.

Each rung point carries the acceptance checks as measured, ``whole_plan_bytes`` (what the
whole plan needs of L1 by the capacity law: its whole chunks x c x the ranks one L1 holds)
and ``rung_outcome``:

- ``pass``: every check PASS: the first passing rung; the size stops here.
- ``exceeds``: the whole plan exceeds the rung's L1 by the law, and the rung answered so:
  the stack stayed healthy and the output canonical, the prefix was not reused. A valid
  observation, shown as EXCEEDS and kept out of the run verdict.
- ``fail``: another check FAILED (wrong output, wrong geometry), or the whole plan fits the
  rung by the law and was not reused.
- ``unknown``: anything else (engine unhealthy, stack failed, timeout): redone once; a clean
  redo supersedes it (``superseded_by``), both stay in the record.
- ``memory_limit``: the rung's L1 does not fit this machine: not deployed; the size stops.

Evidence written before the law decided it says ``capacity`` where a rung was not reused
and nothing else failed (whatever the plan's bytes); readers keep it out of the verdict.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.evidence import EvidenceWriter, Point, Verdict, merge
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.restore.repeats import Pass, repeated_point, rounds
from bsrctl.experiments.restore.spec import ExperimentSpec, load_experiment
from bsrctl.experiments.run import Progress, execute, progress
from bsrctl.specs import stack_selection
from bsrctl.stack.contracts.measures import BY_STACK_KIND, RestoreMeasures, StorageMeasures
from bsrctl.stack.contracts.target import Prompt, Target
from bsrctl.stack.selector import make_target


class LadderWriter(EvidenceWriter):
    """The run verdict merges the rungs that judge the system: rungs the whole plan exceeds
    (the law's answer for a too-small L1) and superseded attempts are kept but not counted."""

    def _points_verdict(self) -> Verdict:
        return merge(
            Verdict(p["verdict"])
            for p in self.doc["points"]
            if p.get("rung_outcome") not in ("exceeds", "capacity") and not p.get("superseded_by")
        )


def whole_plan_bytes(tokens: int, chunk_tokens: int, c: int, ranks_per_l1: int) -> int:
    """What the whole plan (W = 0) stages in one L1 by the capacity law: every whole chunk of
    the prefix, c bytes per rank, for each rank that L1 holds (aux is W > 0's alone)."""
    return tokens // chunk_tokens * c * ranks_per_l1


def rung_outcome(checks: tuple[Check, ...], plan_fits: bool) -> str:
    """Classify a measured rung from its checks and whether its L1 holds the whole plan by
    the law (see the module doc): the law, not the rung's name, decides EXCEEDS."""
    by = {c.name: str(c.verdict) for c in checks}
    if by and all(v == "PASS" for v in by.values()):
        return "pass"
    healthy = by.get("post_request_health") == "PASS"
    others_failed = any(v == "FAIL" for n, v in by.items() if n != "cached_token_accounting")
    if by.get("cached_token_accounting") == "FAIL":
        if not healthy or others_failed:
            return "unknown"
        # Not reused, nothing else wrong: what the law predicts past L1, a failure within it.
        return "fail" if plan_fits else "exceeds"
    if healthy and others_failed:
        return "fail"
    return "unknown"


def _gib(n: int) -> str:
    """Human size of a rung: 2 GiB, 4 MiB."""
    return f"{n / 2**30:g} GiB" if n >= 1 << 30 else f"{n / 2**20:g} MiB"


class _Ladder:
    """One ladder run: sizes x rungs on one target."""

    def __init__(
        self,
        spec: ExperimentSpec,
        selection: dict[str, str],
        target: Target,
        writer: EvidenceWriter,
        say: Progress,
    ) -> None:
        self.spec, self.target, self.w, self.say = spec, target, writer, say
        self.selection, self.stack = selection, selection["kind"]
        reg = spec.registration_for(self.stack)
        # serving: one LMCache L1 holds every rank's chunks; storage: an L1 per rank
        self.ranks_per_l1 = 1 if self.stack == "storage" else reg.tp_size
        self.c, self.chunk_tokens = reg.bytes_per_chunk, reg.chunk_tokens

    def plan_bytes(self, tokens: int, m: RestoreMeasures) -> int:
        """The whole plan by the law, at c as L1 allocates it where the target measured
        that (the storage stack's allocation unit can round c up), else the declared c."""
        allocated = m.bytes_per_chunk_allocated if isinstance(m, StorageMeasures) else None
        c = allocated or self.c
        return whole_plan_bytes(tokens, self.chunk_tokens, c, self.ranks_per_l1)

    def measure(self, tokens: int, rung: int, pid: str, attempt: int) -> tuple[Point, str]:
        params = {"tokens": tokens, "window_chunks": 0, "l1_capacity_bytes": rung}
        lad = self.spec.ladder
        assert lad is not None
        accuracy: RestoreMeasures | None = None
        timed: list[RestoreMeasures] = []
        prompt = Prompt(self.spec.salt, tokens)
        try:
            self.target.deploy(rung, self.spec.settings(0))
            if attempt == 1 and not self.w.doc["stack"].get("registration"):
                self.w.set_stack({**self.target.describe(), **self.selection})
            # back to back on this rung: the accuracy pass, warm-up, the timed passes
            for kind, _k, _ in rounds(1, lad.repeats, lad.warmup_rounds):
                m = self.target.measure(prompt, 0, cold=False, oracle=kind.oracle)
                if kind is Pass.ACCURACY:
                    accuracy = m
                elif kind is Pass.TIMED:
                    timed.append(m)
        except (StackFailed, OSError, RuntimeError, TimeoutError) as exc:
            # Not a capacity answer (engine unhealthy, timeout, L1 not allocatable): UNKNOWN,
            # judged as the target's own measures (its oracle finds nothing: UNKNOWN too).
            why = f"{type(exc).__name__}: {exc}"
            accuracy, timed = BY_STACK_KIND[self.stack](
                tokens, 0, rung, healthy=None, health_detail=f"stack failed: {why}", error=why
            ), []  # fmt: skip
        finally:
            self.target.teardown()
        assert accuracy is not None
        point = repeated_point(pid, params, accuracy, timed, attempt=attempt)
        plan = self.plan_bytes(tokens, accuracy)
        outcome = rung_outcome(point.checks, plan_fits=plan <= rung)
        extra = {**point.extra, "whole_plan_bytes": plan, "rung_outcome": outcome}
        return replace(point, extra=extra), outcome

    def memory_point(self, tokens: int, rung: int, detail: str) -> Point:
        params = {"tokens": tokens, "window_chunks": 0, "l1_capacity_bytes": rung}
        c = check("machine_memory", None, f"rung not deployed: {detail}")
        return Point(f"n{tokens}-l1-{rung}", params, {}, (c,), {"rung_outcome": "memory_limit"})

    def climb(self, tokens: int) -> dict[str, Any]:
        """Every rung of one size until one passes; the size's summary row."""
        row: dict[str, Any] = {
            "tokens": tokens,
            "first_passing_rung_bytes": None,
            "last_failing_rung_bytes": None,
            "l1_peak_bytes": None,
            "memory_ends_at_rung_bytes": None,
            "unresolved_rungs_bytes": [],
            "failed_rungs_bytes": [],
            "whole_plan_bytes": None,
        }
        for rung in self.spec.ladder.rungs_bytes:  # type: ignore[union-attr]
            fits, detail = self.target.fits(rung)
            if not fits:
                self.say(f"N = {tokens}: rung {_gib(rung)} does not fit this machine: {detail}")
                self.w.add_point(self.memory_point(tokens, rung, detail))
                row["memory_ends_at_rung_bytes"] = rung
                row["memory_detail"] = detail
                break
            outcome = self.rung(tokens, rung)
            row["whole_plan_bytes"] = self.w.points[-1].get("whole_plan_bytes")
            if outcome == "pass":
                last = self.w.points[-1]["measures"]
                row["first_passing_rung_bytes"] = rung
                row["l1_peak_bytes"] = last.get("restore_pool_peak_bytes")
                row["l1_used_peak_bytes"] = last.get("l1_used_peak_bytes")
                break
            if outcome == "exceeds":  # the key's name predates the law: the largest exceeded
                row["last_failing_rung_bytes"] = rung
            elif outcome == "fail":
                row["failed_rungs_bytes"].append(rung)
                break
            else:
                row["unresolved_rungs_bytes"].append(rung)
        return row

    def rung(self, tokens: int, rung: int) -> str:
        pid = f"n{tokens}-l1-{rung}"
        self.say(f"N = {tokens} tokens, L1 rung {_gib(rung)}")
        point, outcome = self.measure(tokens, rung, pid, 1)
        self.w.add_point(point)
        if outcome != "unknown" or not self.spec.ladder.redo_unknown:  # type: ignore[union-attr]
            return outcome
        first = len(self.w.points) - 1
        self.say(f"N = {tokens}, rung {_gib(rung)}: not a capacity result, redoing once")
        redo, outcome2 = self.measure(tokens, rung, f"{pid}-redo", 2)
        if outcome2 != "unknown":
            self.w.points[first]["superseded_by"] = redo.id  # flushed with the next point
        self.w.add_point(redo)
        return outcome2


def size_check(row: dict[str, Any]) -> Check:
    n = row["tokens"]
    if row["first_passing_rung_bytes"] is not None:
        last = row["last_failing_rung_bytes"]
        return check(
            f"ladder_n{n}",
            True,
            f"first passing rung {_gib(row['first_passing_rung_bytes'])} (whole plan "
            f"{_gib(row['whole_plan_bytes'])} by the law; largest rung it exceeds: "
            f"{_gib(last) if last else 'none'}), L1 peak {row['l1_peak_bytes']} B",
        )
    if row["failed_rungs_bytes"]:
        return check(f"ladder_n{n}", False, f"rung {_gib(row['failed_rungs_bytes'][-1])} FAILED")
    if row["memory_ends_at_rung_bytes"] is not None:
        why = f"machine memory ends at rung {_gib(row['memory_ends_at_rung_bytes'])}"
    elif row["unresolved_rungs_bytes"]:
        why = f"rungs {[_gib(r) for r in row['unresolved_rungs_bytes']]} unresolved"
    else:
        why = "no rung was large enough: add a larger rung"
    return check(f"ladder_n{n}", None, f"no passing rung: {why}")


def run_ladder(
    spec_path: Path, out_dir: Path, stack: str | None = None, quiet: bool = False
) -> Verdict:
    """Run the spec's `ladder:` section on its ``stack.kind`` (``stack``: ``--stack``, for
    this run); the run verdict."""
    spec, raw = load_experiment(spec_path, "ladder", stack)
    selection = stack_selection(spec, stack)
    stack = spec.stack.kind
    lad = spec.ladder
    assert lad is not None
    say = progress(quiet)
    writer = LadderWriter(out_dir, "ladder", raw, spec.salt, selection)
    target = make_target(spec, writer.run_dir)
    say.watch(target)

    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        prompts = [Prompt(spec.salt, n) for n in lad.sizes_tokens]
        target.prepare(prompts)
        if target.kind == "serving":  # store every prefix once; each rung then only restores
            say("storing the prefixes (one deployment with the spec's L1)")
            target.deploy(spec.stack.lmcache.l1_size_bytes, spec.settings(0))
            try:
                w.set_stack({**target.describe(), **selection})
                target.store(prompts)
            finally:
                target.teardown()
        ladder = _Ladder(spec, selection, target, w, say)
        rows = [ladder.climb(n) for n in lad.sizes_tokens]
        reg = spec.registration_for(stack)
        summary = {
            "rungs_bytes": list(lad.rungs_bytes),
            "bytes_per_chunk": reg.bytes_per_chunk,
            "sizes": rows,
        }
        return summary, [size_check(r) for r in rows]

    return execute(writer, body, target.cleanup, say)
