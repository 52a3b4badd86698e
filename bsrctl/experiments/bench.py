"""Benches write evidence: a run of kind ``bench`` through the one run lifecycle
(``bsrctl.experiments.run.execute``: a new run id, a point per measured mode, summary.md,
the manifest), so ``bsrctl report``, ``compare`` and ``verify`` work on a bench as on any
run. The bench measures in its own body and keeps printing its own lines; the evidence is
the same numbers, with every sample.

A bench point is one mode of the bench (``ttft/W=4 B=8``, ``fs/n65536/bsr W=8 B=16``): its
timed measures as samples in measurement order (the modes interleaved in rotated rounds by
the bench), their medians in ``measures`` and the 95 % seeded bootstrap interval of each
median (``bsrctl.stats.sample_fields``); byte figures beside them, measured once or
identical across rounds. ``spec`` names the bench and its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bsrctl import stats
from bsrctl.evidence import EvidenceWriter, Verdict
from bsrctl.evidence.verdict import Check, Point, check
from bsrctl.experiments.run import execute, progress

SEED = 0  # the bootstrap's: the same samples give the same interval in every report
Body = Callable[[EvidenceWriter], tuple[dict[str, Any], list[Check]]]


def bench_point(
    point_id: str,
    params: Mapping[str, Any],
    samples: Mapping[str, Sequence[float]],
    measures: Mapping[str, Any] | None = None,
    checks: Sequence[Check] = (),
) -> Point:
    """One mode of a bench: ``samples`` (measure -> values, measurement order) become
    medians, samples and intervals; ``measures`` (bytes, peaks) stay as given. Without
    ``checks`` the point carries ``measured``: PASS when every measure has a sample."""
    have = {k: list(v) for k, v in samples.items() if len(v)}
    medians, raw, intervals = stats.sample_fields(have, SEED)
    n = max((len(v) for v in have.values()), default=0)
    if not checks:
        missing = sorted(set(samples) - set(have))
        said = f"{n} samples of {', '.join(raw) or 'nothing'}"
        checks = (check("measured", not missing if have else None,
                        said + (f"; no sample of {missing}" if missing else "")),)  # fmt: skip
    extra = {"repeats": n, "samples": raw, "intervals": intervals}
    return Point(point_id, dict(params), {**(measures or {}), **medians}, tuple(checks), extra)


def run_bench(
    name: str,
    out_dir: Path,
    args: Mapping[str, Any],
    stack: Mapping[str, Any],
    body: Body,
    teardown: Callable[[], None] = lambda: None,
    salt: str = "",
) -> tuple[Verdict, Path]:
    """Run ``body`` as a bench run under ``out_dir`` (its run folder br-bench-<hex>); the
    verdict and the run folder. ``args``: the bench's arguments (the evidence's spec)."""
    spec = {"bench": name, **{k: _plain(v) for k, v in args.items()}}
    writer = EvidenceWriter(out_dir, "bench", spec, salt or name, dict(stack))
    verdict = execute(writer, body, teardown, progress(True))
    return verdict, writer.run_dir


def _plain(v: Any) -> Any:
    """An argument as JSON keeps it (paths as text)."""
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v
