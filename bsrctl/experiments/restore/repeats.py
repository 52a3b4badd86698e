"""Repeated restore points: the passes that measure them and the point their passes make.

Every point (an *arm*: one size at one W) runs one **accuracy pass** with the oracle on
(serving: the install read-back; storage: the destination compares every installed byte
with its canonical bytes while installing) and ``repeats`` **timed passes** on the
production path (oracle off: nothing per window that production would not do), as MLPerf
LoadGen runs accuracy and performance modes apart. No time is taken from the accuracy pass;
no in-span oracle verdict (``ORACLE_CHECKS``: the install read-back) from a timed pass;
every other check judges every pass: the bound, the accounting, and the bytes, which each
timed pass checks after its timer stopped (serving: its output against the reference;
storage: its destination's bytes against the canonical ones, timed apart in
``bytes_check_s``, never sampled). The accuracy round comes first, in arm order; then
``warmup`` discarded rounds; then the timed rounds, timed round r visiting the arms rotated
by r (arms[r:] + arms[:r]), so slow drift of a shared machine lands on every arm about alike
and the arms of one round are a paired comparison. With one timed pass the points thus
complete in arm order, as a single-measurement run's did.

The passes of one point make one evidence point (the convention of bsrctl.evidence.schema):
``measures`` are the accuracy pass's with every timed measure replaced by its timed median,
``samples`` the timed passes' raw values in measurement order (``sample_path`` says so),
``intervals`` the 95 % seeded bootstrap interval of the median (``bsrctl.stats.
sample_fields``, two samples or more), ``accuracy_pass`` the oracle pass's own times and
(storage) ``timed_bytes_check_s`` each timed pass's after-timer byte check, in pass order,
and ``timed_bad_objects`` every object a timed pass found not canonical or the tier refused.
Byte measures are not sampled: they must be identical in every pass, and
``repeats_identical`` FAILs naming each one that is not. A check whose verdict differs
between passes keeps the worst one, with the pass it came from.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from enum import Enum
from typing import Any

from bsrctl import stats
from bsrctl.evidence.verdict import Check, Point, Verdict, check
from bsrctl.experiments.restore.acceptance import judge
from bsrctl.stack.contracts.measures import RestoreMeasures, ServingMeasures, StorageMeasures

# The bootstrap's seed: the same samples give the same interval in every run and report.
SEED = 0
# Each target's timed measures, sampled where every repeat measured them.
TIMED: dict[type[RestoreMeasures], tuple[str, ...]] = {
    ServingMeasures: ("ttft_s", "restore_s", "retrieve_s"),
    StorageMeasures: ("restore_s", "probe_s", "retrieve_s"),
}
# What must not move between repeats of one point: the restore pool, what was restored and
# from where, the tokens reused, and the output (serving) or the bytes compared (storage).
_POOL = ("restore_pool_peak_bytes", "restore_pool_peak_bytes_by_rank", "bytes_restored")
IDENTICAL: dict[type[RestoreMeasures], tuple[str, ...]] = {
    ServingMeasures: (*_POOL, "cached_tokens", "external_hit_tokens", "output_sha256",
                      "windows_done"),
    StorageMeasures: (*_POOL, "cached_tokens", "windows_done", "verify_mismatches"),
}  # fmt: skip
WORST = {Verdict.FAIL: 2, Verdict.UNKNOWN: 1, Verdict.PASS: 0}
# Checks whose verdict needs the in-span oracle: judged on the accuracy pass only.
ORACLE_CHECKS = frozenset({"install_readback"})
# What a point's ``sample_path`` says of its samples.
PRODUCTION = "production"


class Pass(Enum):
    """What a round measures (module doc)."""

    ACCURACY = "accuracy"
    WARMUP = "warm-up"
    TIMED = "timed"

    @property
    def oracle(self) -> bool:
        return self is Pass.ACCURACY


def rounds(arms: int, repeats: int, warmup: int) -> Iterator[tuple[Pass, int, list[int]]]:
    """(pass, its index among its kind, arm indices in visiting order) for every round: the
    accuracy round, ``warmup`` discarded rounds, then ``repeats`` timed ones (index 0 ..
    repeats-1); round k of each kind rotated by k."""
    kinds = [Pass.ACCURACY] + [Pass.WARMUP] * warmup + [Pass.TIMED] * repeats
    seen: dict[Pass, int] = {}
    for kind in kinds:
        idx = seen.get(kind, 0)
        seen[kind] = idx + 1
        shift = idx % arms if arms else 0
        order = list(range(arms))
        yield kind, idx, order[shift:] + order[:shift]


def round_note(kind: Pass, idx: int, repeats: int) -> str:
    """The console's note of which pass a measurement is."""
    if kind is Pass.ACCURACY:
        return " (accuracy pass)"
    if kind is Pass.WARMUP:
        return " (warm-up, discarded)"
    return f" (timed {idx + 1}/{repeats})"


def target_type(ms: Sequence[RestoreMeasures]) -> type[RestoreMeasures]:
    """The one measures type of a point's passes (one target measured them all)."""
    types = {type(m) for m in ms}
    if len(types) != 1:
        got = sorted(t.__name__ for t in types)
        raise ValueError(f"a point's passes are of one target, got {got}")
    return types.pop()


def timed_samples(ms: Sequence[RestoreMeasures]) -> dict[str, list[float]]:
    """Each timed measure every timed pass measured, in measurement order."""
    out: dict[str, list[float]] = {}
    for name in TIMED[target_type(ms)]:
        vals = [getattr(m, name) for m in ms]
        if all(v is not None for v in vals):
            out[name] = [float(v) for v in vals]
    return out


def identical_check(ms: Sequence[RestoreMeasures]) -> Check:
    """``repeats_identical``: every byte measure the same in every pass (the accuracy pass
    first); FAIL names each that moved, with its value per pass."""
    moved = {}
    same = IDENTICAL[target_type(ms)]
    for name in same:
        vals = [getattr(m, name) for m in ms]
        if any(v != vals[0] for v in vals[1:]):
            moved[name] = vals
    if moved:
        said = "; ".join(f"{k} per pass {v}" for k, v in moved.items())
        return check("repeats_identical", False, f"differ between the {len(ms)} passes: {said}")
    return check(
        "repeats_identical",
        True,
        f"{', '.join(same)} identical over {len(ms)} passes (peak "
        f"{ms[0].restore_pool_peak_bytes} B)",
    )


def merged_checks(accuracy: RestoreMeasures, timed: Sequence[RestoreMeasures]) -> list[Check]:
    """Every pass judged, in the accuracy pass's check order; an oracle check is the
    accuracy pass's, any other the worst over the passes that judged it (named)."""
    passes = [("accuracy pass", judge(accuracy))] + [
        (f"timed pass {r + 1}", judge(m)) for r, m in enumerate(timed)
    ]
    out: list[Check] = []
    for first in passes[0][1]:
        if first.name in ORACLE_CHECKS:
            out.append(first)
            continue
        mine = [(name, c) for name, cs in passes for c in cs if c.name == first.name]
        which, worst = max(mine, key=lambda nc: WORST[nc[1].verdict])
        if all(c.verdict == first.verdict for _, c in mine):
            out.append(first)
        else:
            out.append(replace(worst, detail=f"{which}: {worst.detail}"))
    return out


def with_medians(m: RestoreMeasures, medians: dict[str, float]) -> RestoreMeasures:
    """The accuracy pass's measures with every sampled measure replaced by its timed median
    (its read-back seconds stay: they time the oracle, on the accuracy pass)."""
    return replace(m, **medians)


def accuracy_times(m: RestoreMeasures) -> dict[str, float]:
    """The accuracy pass's own times: shown beside the timed medians, never sampled."""
    return {k: float(v) for k in TIMED[type(m)] if (v := getattr(m, k)) is not None}


def repeated_point(
    point_id: str,
    params: dict[str, Any],
    accuracy: RestoreMeasures,
    timed: Sequence[RestoreMeasures],
    **extra: Any,
) -> Point:
    """One evidence point from a point's accuracy pass and timed passes (module doc); no
    timed pass (the stack failed before one): the accuracy pass's point, no samples."""
    # every pass's restore request, accuracy first (the report's timeline reads them); the
    # storage target records none (its spans name the restore alone)
    passes = [m for m in (accuracy, *timed) if isinstance(m, ServingMeasures)]
    ids = [m.request_id for m in passes if m.request_id]
    if ids:
        extra = {**extra, "request_ids": ids}
    if not timed:
        return Point(point_id, params, accuracy.to_json(), judge(accuracy), extra)
    checked = [m.bytes_check_s for m in timed if isinstance(m, StorageMeasures)]
    if checked and None not in checked:  # the timed passes' after-timer byte checks, apart
        extra = {**extra, "timed_bytes_check_s": checked}
    bad = {
        f"timed pass {r + 1}": {
            "mismatched_objects": list(m.mismatched_objects or ()),
            "tier_rejected_objects": list(m.tier_rejected_objects or ()),
        }
        for r, m in enumerate(timed)
        if isinstance(m, StorageMeasures) and (m.mismatched_objects or m.tier_rejected_objects)
    }
    if bad:  # every object a timed pass found bad (its measures are not the point's)
        extra = {**extra, "timed_bad_objects": bad}
    medians, samples, intervals = stats.sample_fields(timed_samples(timed), SEED)
    checks = (*merged_checks(accuracy, timed), identical_check([accuracy, *timed]))
    more = {
        **extra,
        "repeats": len(timed),
        "samples": samples,
        "intervals": intervals,
        "sample_path": PRODUCTION,
        "accuracy_pass": accuracy_times(accuracy),
    }
    return Point(point_id, params, with_medians(accuracy, medians).to_json(), checks, more)
