"""`bsrctl sweep`: one deployment, W fixed, L1 fixed, the prefix size over a list (the
paper's E1). All points in one evidence block, run id br-e1-<12 hex>; no engine relaunch.

With ``sweep.whole_plan_contrast`` each size also runs at W = 0 on the same engines (the
window is switched at run time), so one run shows a flat restore pool for W > 0 and a
growing one for W = 0, and W's TTFT (storage: restore time) against the whole plan's per
size, as the ratio over paired repeats with its interval (``sweep.whole_plan_max_ratio``
judges it). Each point is measured ``sweep.repeats`` times in rotated rounds
(``repeats.rounds``), after its accuracy pass. ``repeat_new_salt`` reruns the largest size
once with a fresh salt (one pass, the oracle on: its verdict is bytes).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bsrctl import stats
from bsrctl.evidence import EvidenceWriter, Verdict
from bsrctl.evidence.schema import PointDoc
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.restore.acceptance import restore_point
from bsrctl.experiments.restore.repeats import SEED, Pass, repeated_point, round_note, rounds
from bsrctl.experiments.restore.spec import ExperimentSpec, load_experiment
from bsrctl.experiments.run import execute, progress
from bsrctl.specs import stack_selection
from bsrctl.stack.contracts.deployment import Deployment
from bsrctl.stack.contracts.measures import RestoreMeasures
from bsrctl.stack.contracts.target import Prompt
from bsrctl.stack.selector import make_target


def run_sweep(
    spec_path: Path,
    out_dir: Path,
    stack: str | None = None,
    quiet: bool = False,
    repeat_new_salt: bool = False,
    deployment: Deployment | None = None,
) -> Verdict:
    """Run the spec's `sweep:` section on its ``stack.kind`` (``stack``: ``--stack``, for this
    run); the run verdict. ``deployment``: a serving one already made (``make_target``)."""
    spec, raw = load_experiment(spec_path, "sweep", stack)
    selection = stack_selection(spec, stack)
    kind = spec.stack.kind
    sw = spec.sweep
    assert sw is not None
    say = progress(quiet)
    new_salt = f"{spec.salt}-repeat-{secrets.token_hex(4)}" if repeat_new_salt else ""
    writer = EvidenceWriter(out_dir, "sweep", raw, spec.salt, selection)
    target = make_target(spec, writer.run_dir, deployment)
    windows = [sw.window_chunks] + ([0] if sw.whole_plan_contrast and sw.window_chunks else [])
    arms = [(n, win) for n in sw.sizes_tokens for win in windows]
    say.watch(target)
    say.expect(len(arms) + (1 if new_salt else 0))  # points (a point: all its passes)

    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        prompts = [Prompt(spec.salt, n) for n in sw.sizes_tokens]
        if new_salt:
            prompts.append(Prompt(new_salt, sw.sizes_tokens[-1]))
        say(f"preparing the {kind} stack ({len(prompts)} prompts)")
        target.prepare(prompts)
        l1 = spec.stack.lmcache.l1_size_bytes
        say(f"deploying: L1 {target.l1_bytes(l1)} B, W = {sw.window_chunks}")
        target.deploy(l1, spec.settings(sw.window_chunks, sw.admission_budget_chunks))
        w.set_stack({**target.describe(), **selection})
        accuracy: dict[int, RestoreMeasures] = {}  # the accuracy pass also seeds (serving)
        timed: list[list[RestoreMeasures]] = [[] for _ in arms]
        for kind_, k, order in rounds(len(arms), sw.repeats, sw.warmup_rounds):
            for i in order:
                n, win = arms[i]
                say(f"N = {n} tokens, W = {win}{round_note(kind_, k, sw.repeats)}")
                m = target.measure(
                    Prompt(spec.salt, n), win, cold=i not in accuracy, oracle=kind_.oracle
                )
                say.step("check")
                if kind_ is Pass.ACCURACY:
                    accuracy[i] = m
                elif kind_ is Pass.TIMED:
                    timed[i].append(m)
                if kind_ is Pass.TIMED and k == sw.repeats - 1:  # its last pass: on disk now
                    pid = f"n{n}-w{win}"
                    point = repeated_point(pid, _params(n, win, l1), accuracy[i], timed[i])
                    w.add_point(point)
        by_id = {f"n{n}-w{win}": k for k, (n, win) in enumerate(arms)}
        w.points.sort(key=lambda p: by_id.get(p["id"], len(arms)))  # arm order, not rotated
        if new_salt:
            n = sw.sizes_tokens[-1]
            target.forget_salt_files()  # bound disk: the old salt's files are not reused
            say(f"repeat N = {n} with a new salt {new_salt}")
            m = target.measure(Prompt(new_salt, n), sw.window_chunks)
            pid = f"n{n}-w{sw.window_chunks}-new-salt"
            w.add_point(
                restore_point(pid, {**_params(n, sw.window_chunks, l1), "salt": new_salt}, m)
            )
        return summarize(w.points, spec, kind)

    return execute(writer, body, target.cleanup, say)


def _params(tokens: int, window_chunks: int, l1: int) -> dict[str, Any]:
    return {"tokens": tokens, "window_chunks": window_chunks, "l1_capacity_bytes": l1}


def summarize(
    written: list[dict[str, Any]], spec: ExperimentSpec, stack: str
) -> tuple[dict[str, Any], list[Check]]:
    """Peaks by size, whether the W > 0 peak is identical to the byte across sizes, whether
    the W = 0 peak grows with the prefix. The points are read through the evidence schema's
    model, so a point the schema refuses fails here, not in a reader of the run."""
    sw = spec.sweep
    assert sw is not None
    reg = spec.registration_for(stack)
    w = sw.window_chunks
    points = [PointDoc.model_validate(p) for p in written]
    main = [p for p in points if p.params["window_chunks"] == w and "salt" not in p.params]
    peaks = {p.params["tokens"]: p.measures.get("restore_pool_peak_bytes") for p in main}
    summary: dict[str, Any] = {
        "window_chunks": w,
        "bytes_per_chunk": reg.bytes_per_chunk,
        "window_bytes": reg.window_bytes(w),
        "rws_bound_bytes": reg.rws_bound_bytes(w) if w else None,
        "restore_pool_peak_bytes_by_tokens": peaks,
        "restore_s_by_tokens": {p.params["tokens"]: p.measures.get("restore_s") for p in main},
    }
    checks: list[Check] = []
    if w:
        # A prefix shorter than W chunks stages fewer bytes: compare sizes with N >= W only.
        full = {n: v for n, v in peaks.items() if n // reg.chunk_tokens >= w}
        distinct = set(full.values())
        same = len(distinct) == 1 and None not in distinct
        summary["peak_identical_across_sizes"] = same
        summary["peak_equals_window_bytes"] = same and distinct == {reg.window_bytes(w)}
        checks.append(
            check(
                "peak_independent_of_n",
                same if full and None not in distinct else None,
                f"W = {w}: restore-pool peak {sorted(distinct, key=str)} B over sizes "
                f"{sorted(full)} (W*c = {reg.window_bytes(w)} B)",
            )
        )
    whole = [p for p in points if p.params["window_chunks"] == 0 and "salt" not in p.params]
    if whole:
        wp = {p.params["tokens"]: p.measures.get("restore_pool_peak_bytes") for p in whole}
        vals = [wp[n] for n in sorted(wp)]
        grows = (
            None
            if None in vals or len(vals) < 2
            else all(b > a for a, b in zip(vals, vals[1:], strict=False))
        )
        summary["whole_plan_peak_bytes_by_tokens"] = wp
        summary["whole_plan_peak_grows"] = grows
        if w:
            checks.append(check("whole_plan_grows_with_n", grows, f"W = 0 peaks by size: {wp}"))
            ratios, judged = whole_plan_ratios(main, whole, stack, sw.whole_plan_max_ratio)
            summary["whole_plan_ratio_by_tokens"] = ratios
            checks += judged
    repeat = [p for p in points if "salt" in p.params]
    if repeat:
        r = repeat[-1]
        summary["repeat_new_salt"] = {
            "salt": r.params["salt"],
            "verdict": r.verdict,
            "restore_pool_peak_bytes": r.measures.get("restore_pool_peak_bytes"),
        }
    return summary, checks


def _samples(point: PointDoc, metric: str) -> list[float] | None:
    """A point's samples of ``metric`` (its one value when measured once); None: missing."""
    got = point.samples.get(metric)
    if got:
        return list(got)
    one = point.measures.get(metric)
    return None if one is None else [float(one)]


def whole_plan_ratios(
    windowed: Sequence[PointDoc],
    whole: Sequence[PointDoc],
    stack: str,
    bound: float | None,
) -> tuple[dict[int, dict[str, Any]], list[Check]]:
    """Per size: W's TTFT (storage, which has no model: restore time) / the whole plan's,
    over the paired repeats (round i of both), its interval and the verdict of the claim
    ratio <= ``bound`` (1 when unset); a run check per size only when ``bound`` is set."""
    metric = "restore_s" if stack == "storage" else "ttft_s"
    zero = {p.params["tokens"]: p for p in whole}
    out: dict[int, dict[str, Any]] = {}
    checks: list[Check] = []
    for p in windowed:
        n = p.params["tokens"]
        a, b = _samples(p, metric), (_samples(zero[n], metric) if n in zero else None)
        name = f"whole_plan_ratio_n{n}"
        if a is None or b is None or len(a) != len(b) or 0.0 in b:
            row = {"metric": metric, "verdict": "UNKNOWN", "detail": f"{metric} not paired"}
        else:
            o = stats.ordering_verdict(a, b, "a<=b", "ratio", SEED, bound)
            iv = o.interval
            row = {
                "metric": metric,
                "ratio": iv.estimate,
                "interval": iv.as_list() if iv.testable else None,
                "repeats": iv.n,
                "bound": o.threshold,
                "judged": bound is not None,
                "verdict": o.verdict,
                "repeats_to_decide": o.repeats_needed,
                "detail": f"{metric} W/whole plan at N = {n}: {o.detail}",
            }
        out[n] = row
        if bound is not None:
            checks.append(Check(name, Verdict(row["verdict"]), row["detail"]))
    return out, checks
