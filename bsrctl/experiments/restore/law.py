"""`bsrctl law`: one prefix size, W over a list (default 8, 16, 32, 64) on one deployment;
least-squares fit of the restore-pool peak against W. PASS only when the slope is within
``law.slope_tolerance`` (1%) of the registration's bytes per chunk c and R² >= ``law.min_r2``
(0.999). The fit is exact (rational arithmetic); the fitted slope is printed. Each W is
measured once with the oracle on (the accuracy pass, whose peaks the fit reads) and
``law.repeats`` times on the production path in rotated rounds (default 1: the fit is of
bytes, which ``repeats_identical`` holds equal across passes)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

from bsrctl.evidence import EvidenceWriter, Verdict
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.restore.repeats import Pass, repeated_point, round_note, rounds
from bsrctl.experiments.restore.spec import load_experiment
from bsrctl.experiments.run import execute, progress
from bsrctl.specs import stack_selection
from bsrctl.stack.contracts.deployment import Deployment
from bsrctl.stack.contracts.measures import RestoreMeasures
from bsrctl.stack.contracts.target import Prompt
from bsrctl.stack.selector import make_target


def fit_line(xs: list[int], ys: list[int]) -> tuple[Fraction, Fraction, float | None]:
    """Least squares y = slope*x + intercept, exactly; R² (None when y does not vary)."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError(f"need at least 2 distinct x to fit a line, got {xs}")
    mx, my = Fraction(sum(xs), n), Fraction(sum(ys), n)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (slope * x + intercept)) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = None if ss_tot == 0 else float(1 - ss_res / ss_tot)
    return slope, intercept, r2


def law_check(
    windows: list[int], peaks: list[int | None], c: int, tolerance: float, min_r2: float
) -> tuple[Check, dict[str, Any]]:
    """The capacity law over measured (W, peak) pairs; missing peaks -> UNKNOWN."""
    if any(p is None for p in peaks) or len(windows) < 3:
        return check("capacity_law", None, f"peaks missing or < 3 windows: {peaks}"), {}
    slope, intercept, r2 = fit_line(windows, [int(p) for p in peaks if p is not None])
    rel = float((slope - c) / c)
    fit = {
        "slope_bytes_per_chunk": float(slope),
        "intercept_bytes": float(intercept),
        "r2": r2,
        "bytes_per_chunk": c,
        "slope_relative_error": rel,
        "slope_equals_c_exactly": slope == c,
        "windows_chunks": windows,
        "restore_pool_peak_bytes": peaks,
    }
    detail = (
        f"slope {float(slope):.1f} B/chunk vs c = {c} B ({rel:+.4%}, tolerance "
        f"{tolerance:.2%}); intercept {float(intercept):.1f} B; R² "
        f"{'undefined' if r2 is None else f'{r2:.6f}'} (min {min_r2})"
    )
    ok = None if r2 is None else abs(rel) <= tolerance and r2 >= min_r2
    return check("capacity_law", ok, detail), fit


def run_law(
    spec_path: Path,
    out_dir: Path,
    stack: str | None = None,
    quiet: bool = False,
    deployment: Deployment | None = None,
) -> Verdict:
    """Run the spec's `law:` section on its ``stack.kind`` (``stack``: ``--stack``, for this
    run); the run verdict. ``deployment``: a serving one already made (``make_target``)."""
    spec, raw = load_experiment(spec_path, "law", stack)
    selection = stack_selection(spec, stack)
    stack = spec.stack.kind
    law = spec.law
    assert law is not None
    say = progress(quiet)
    reg = spec.registration_for(stack)
    writer = EvidenceWriter(out_dir, "law", raw, spec.salt, selection)
    target = make_target(spec, writer.run_dir, deployment)
    say.watch(target)
    say.expect(len(law.windows_chunks))
    l1 = spec.stack.lmcache.l1_size_bytes

    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        prompt = Prompt(spec.salt, law.tokens)
        target.prepare([prompt])
        first = law.windows_chunks[0]
        say(f"deploying: L1 {target.l1_bytes(l1)} B, W = {first}")
        target.deploy(l1, spec.settings(first))
        w.set_stack({**target.describe(), **selection})
        wins = list(law.windows_chunks)
        accuracy: dict[int, RestoreMeasures] = {}  # each W's accuracy pass seeds (serving)
        timed: list[list[RestoreMeasures]] = [[] for _ in wins]
        for kind, k, order in rounds(len(wins), law.repeats, law.warmup_rounds):
            for i in order:
                win = wins[i]
                say(f"N = {law.tokens} tokens, W = {win}{round_note(kind, k, law.repeats)}")
                m = target.measure(prompt, win, cold=i not in accuracy, oracle=kind.oracle)
                say.step("check")
                if kind is Pass.ACCURACY:
                    accuracy[i] = m
                elif kind is Pass.TIMED:
                    timed[i].append(m)
                if kind is Pass.TIMED and k == law.repeats - 1:
                    params = {"tokens": law.tokens, "window_chunks": win, "l1_capacity_bytes": l1}
                    pid = f"n{law.tokens}-w{win}"
                    w.add_point(repeated_point(pid, params, accuracy[i], timed[i]))
        w.points.sort(key=lambda p: p["params"]["window_chunks"])  # W order, not rotated
        peaks: list[int | None] = [accuracy[i].restore_pool_peak_bytes for i in range(len(wins))]
        c, fit = law_check(
            list(law.windows_chunks), peaks, reg.bytes_per_chunk, law.slope_tolerance, law.min_r2
        )
        say.result(f"law ({stack}): {c.detail}: {c.verdict}")
        return {"tokens": law.tokens, "fit": fit}, [c]

    return execute(writer, body, target.cleanup, say)
