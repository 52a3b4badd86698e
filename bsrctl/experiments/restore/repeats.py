"""Repeated restore points: the rounds that measure them and the point their repeats make.

A point (an *arm*: one size at one W) is measured once per round. Round r visits the arms
rotated by r (arms[r:] + arms[:r]), so slow drift of a shared machine lands on every arm
about alike and the arms of one round are a paired comparison; warm-up rounds go first, in
the same rotation, and are discarded.

The repeats of one point make one evidence point (the convention of bsrctl.evidence.schema):
``measures`` keep every timed measure's median (so every reader of one number keeps
working), ``samples`` the raw values in measurement order and ``intervals`` the 95 % seeded
bootstrap interval of the median (``bsrctl.stats.sample_fields``). Byte measures are not
sampled: they must be identical across repeats, and ``repeats_identical`` FAILs naming each
one that is not. Every repeat is judged by the acceptance checks; a check whose verdict
differs between repeats keeps the worst one, with the repeat it came from.

One measurement (repeats 1) gives exactly the point it always gave: no samples, no
intervals, no ``repeats_identical``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from bsrctl import stats
from bsrctl.evidence.verdict import Check, Point, Verdict, check
from bsrctl.experiments.restore.acceptance import judge
from bsrctl.stack.target import RestoreMeasures

# The bootstrap's seed: the same samples give the same interval in every run and report.
SEED = 0
# Timed measures of RestoreMeasures, sampled where every repeat measured them.
TIMED = ("ttft_s", "restore_s", "probe_s")
# Timed measures inside ``readback`` (serving, W > 0): the per-window phases reported
# (read-back and install + sync seconds), flattened as the schema names nested measures.
READBACK_TIMED = ("seconds", "install_seconds")
# What must not move between repeats of one point: the restore pool, what was restored and
# from where, the tokens reused and the output.
IDENTICAL = (
    "restore_pool_peak_bytes",
    "restore_pool_peak_bytes_by_rank",
    "bytes_restored",
    "cached_tokens",
    "external_hit_tokens",
    "output_sha256",
    "windows_done",
    "verify_mismatches",
)
WORST = {Verdict.FAIL: 2, Verdict.UNKNOWN: 1, Verdict.PASS: 0}


def rounds(arms: int, repeats: int, warmup: int) -> Iterator[tuple[int, list[int]]]:
    """(round, arm indices in visiting order) for every round; warm-up rounds are numbered
    below 0 (-warmup .. -1) and the measured ones 0 .. repeats-1, all rotated by one."""
    for k in range(warmup + repeats):
        shift = k % arms if arms else 0
        order = list(range(arms))
        yield k - warmup, order[shift:] + order[:shift]


def round_note(rnd: int, repeats: int) -> str:
    """The console's note of which round a measurement is ("" for a single one)."""
    if rnd < 0:
        return " (warm-up, discarded)"
    return f" (repeat {rnd + 1}/{repeats})" if repeats > 1 else ""


def timed_samples(ms: Sequence[RestoreMeasures]) -> dict[str, list[float]]:
    """Each timed measure every repeat measured, in measurement order."""
    out: dict[str, list[float]] = {}
    for name in TIMED:
        vals = [getattr(m, name) for m in ms]
        if all(v is not None for v in vals):
            out[name] = [float(v) for v in vals]
    for name in READBACK_TIMED:
        vals = [(m.readback or {}).get(name) for m in ms]
        if all(v is not None for v in vals):
            out[f"readback.{name}"] = [float(v) for v in vals]
    return out


def identical_check(ms: Sequence[RestoreMeasures]) -> Check:
    """``repeats_identical``: every byte measure the same in every repeat; FAIL names each
    that moved, with its value per repeat."""
    moved = {}
    for name in IDENTICAL:
        vals = [getattr(m, name) for m in ms]
        if any(v != vals[0] for v in vals[1:]):
            moved[name] = vals
    if moved:
        said = "; ".join(f"{k} per repeat {v}" for k, v in moved.items())
        return check("repeats_identical", False, f"differ between the {len(ms)} repeats: {said}")
    return check(
        "repeats_identical",
        True,
        f"{', '.join(IDENTICAL)} identical over {len(ms)} repeats (peak "
        f"{ms[0].restore_pool_peak_bytes} B)",
    )


def merged_checks(ms: Sequence[RestoreMeasures], stack: str) -> list[Check]:
    """Every repeat judged; per check the first repeat's, or the worst where they differ."""
    judged = [judge(m, stack) for m in ms]
    out: list[Check] = []
    for i, first in enumerate(judged[0]):
        mine = [
            (r, cs[i]) for r, cs in enumerate(judged) if i < len(cs) and cs[i].name == first.name
        ]
        r, worst = max(mine, key=lambda rc: WORST[rc[1].verdict])
        if all(c.verdict == first.verdict for _, c in mine):
            out.append(first)
        else:
            out.append(replace(worst, detail=f"repeat {r}: {worst.detail}"))
    return out


def with_medians(m: RestoreMeasures, medians: dict[str, float]) -> RestoreMeasures:
    """The first repeat's measures with every sampled measure replaced by its median."""
    top = {k: v for k, v in medians.items() if "." not in k}
    readback = dict(m.readback) if m.readback is not None else None
    for k, v in medians.items():
        if k.startswith("readback.") and readback is not None:
            readback[k.removeprefix("readback.")] = v
    return replace(m, **top, readback=readback)


def repeated_point(
    point_id: str,
    params: dict[str, Any],
    ms: Sequence[RestoreMeasures],
    stack: str,
    **extra: Any,
) -> Point:
    """One evidence point from a point's repeats (module doc)."""
    if not ms:
        raise ValueError(f"{point_id}: no repeats measured")
    if len(ms) == 1:
        return Point(point_id, params, ms[0].to_json(), judge(ms[0], stack), extra)
    medians, samples, intervals = stats.sample_fields(timed_samples(ms), SEED)
    checks = (*merged_checks(ms, stack), identical_check(ms))
    more = {**extra, "repeats": len(ms), "samples": samples, "intervals": intervals}
    return Point(point_id, params, with_medians(ms[0], medians).to_json(), checks, more)
