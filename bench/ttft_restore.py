"""TTFT restored from the FS L2 at W = 0, 4, 16 against recomputing, on the serving stack.

    PYTHONPATH=$PWD .venv/bin/python bench/ttft_restore.py [--tokens 16384] [--repeat 5]
        [--spec ladders/cpu-e1.yaml] [--out DIR] [--evidence reports]

The serving target of ``make demo`` (``make_target(spec, ...)``: vLLM CPU with the
tiny Llama, LMCache MP server with the BSR module, FS L2), one deployment. The prompt is
stored once into the FS L2; then every mode runs in rotated rounds (``repeats.rounds``):
  W=0               stock lookup + whole-plan prefetch, through the module's pass-through
  W=4, W=16         BSR windows at B = 2W (window j+1 fetched while j installs), the
                    windows staged directly by the restoring thread (the default)
  W=4/16 prefetch   the same through LMCache's prefetch controller, one task per window
                    (``restore.window_staging: prefetch``): the per-window cost cut, A/B
  recompute         a prompt of the same length that no tier holds (a fresh salt per round)
The first round is the **accuracy pass**: the install read-back on (every window's bytes
compared after install), the output compared with the canonical one; a mismatch stops the
bench. Then one warm-up round and ``--repeat`` **timed rounds on the production path**: no
read-back, nothing per window that production would not do; only these are sampled. Before
each restore L1 and vLLM's prefix cache are emptied (``target.measure``), so only the FS L2
can serve. TTFT is vLLM's own histogram delta; restore_s spans the lookup of the prefix to
the last byte installed at every W.

Per-window fixed cost: per timed round, each window's fetch + install + sync at W = 4 and
W = 16 (16 and 4 windows of a 64-chunk prefix, 1:4 bytes) fit ``a + b * bytes``; ``a`` is
the cost a window pays whatever its bytes (``fixed = (4 t4 - t16) / 3``), printed before
the bytes' share, per phase, with the median's 95 % interval over the rounds.

Evidence: a ``bench`` run under --evidence (``bsrctl.experiments.bench``): a point per mode
with the timed rounds' TTFT, restore time and first-window time as samples (median and 95 %
interval, ``sample_path: production``), the accuracy pass's read-back and output verdicts
as checks, the restore-pool peaks (``peak_identical`` FAILs when they move between passes).

Last line: ``ttft W=4/whole-plan=… [lo, hi] W=16/whole-plan=… [lo, hi] window-fixed-ms=…
[lo, hi]``, the per-round ratios' median with its 95 % bootstrap interval
(``stats.paired_ratio_ci``); the lines before it give restore_s, the prefetch staging and
recomputing.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from bsrctl.evidence.verdict import Check, Point, check
from bsrctl.experiments.bench import SEED, bench_point, run_bench
from bsrctl.experiments.restore.repeats import PRODUCTION, Pass, rounds
from bsrctl.experiments.restore.spec import ExperimentSpec
from bsrctl.prompts import prompt_ids
from bsrctl.spec_io import read_yaml
from bsrctl.stack.contracts.bsr_client import outcomes_since
from bsrctl.stack.contracts.target import Prompt
from bsrctl.stack.selector import make_target
from bsrctl.stats import Interval, median_ci, paired_ratio_ci

PHASES = ("fetch_s", "install_s", "sync_s")  # a window's own work (not its waits)


class Mode(NamedTuple):
    w: int  # -1: recompute
    b: int
    staging: str

    @property
    def label(self) -> str:
        if self.w < 0:
            return "recompute"
        if self.w == 0:
            return "W=0"
        return f"W={self.w}" + ("" if self.staging == "direct" else " prefetch")


MODES = (
    Mode(0, 0, "direct"),
    Mode(4, 8, "direct"),
    Mode(16, 32, "direct"),
    Mode(4, 8, "prefetch"),
    Mode(16, 32, "prefetch"),
    Mode(-1, 0, "direct"),
)


def window_means(outcomes: list[Any]) -> dict[str, float]:
    """Per-window means (s) of every phase over the request's BSR windows (all ranks)."""
    ws = [w for o in outcomes if o.mode == "bsr" for w in (o.window_phases or ())]
    if not ws:
        return {}
    out = {k: sum(w[k] for w in ws) / len(ws) for k in (*PHASES, "wait_s", "admit_wait_s")}
    out["windows"] = len(ws)
    out["first_s"] = min(w["installed_at_s"] for w in ws if w["index"] == 0)
    return out


def fixed_costs(w4: list[dict[str, float]], w16: list[dict[str, float]]) -> dict[str, Any]:
    """Per phase and for their sum: the per-round fixed cost (ms) of a window, from W = 4
    and W = 16 windows of 1:4 bytes (module doc), as a median with its interval."""
    out: dict[str, Any] = {}
    for name in (*PHASES, "window"):

        def t(r: dict[str, float], name: str = name) -> float:
            return sum(r[k] for k in PHASES) if name == "window" else r[name]

        fixed = [1000 * (4 * t(a) - t(b)) / 3 for a, b in zip(w4, w16, strict=True)]
        per_mib = [1000 * (t(b) - t(a)) / 3 for a, b in zip(w4, w16, strict=True)]
        out[name] = (median_ci(fixed, SEED), median_ci(per_mib, SEED), fixed)
    return out


def points(
    tokens: int,
    timed: dict[str, dict[str, list[float]]],
    peaks: dict[str, list[int | None]],
    accuracy: dict[str, list[Check]],
) -> list[Point]:
    """A point per mode: the timed rounds' samples (production path), the accuracy pass's
    checks and ``peak_identical`` over every pass."""
    out = []
    for m in MODES:
        seen = sorted(set(peaks[m.label]), key=str)
        checks = list(accuracy.get(m.label, []))
        if seen:
            checks.append(check("peak_identical", len(seen) == 1,
                                f"restore-pool peak per pass {peaks[m.label]} B"))  # fmt: skip
        params = {"tokens": tokens, "window_chunks": max(m.w, 0), "budget_chunks": m.b,
                  "mode": m.label, "window_staging": m.staging}  # fmt: skip
        samples = {k: v for k, v in timed[m.label].items() if v}
        p = bench_point(f"ttft/{m.label}", params, samples,
                        {"restore_pool_peak_bytes": seen[0] if len(seen) == 1 else None},
                        checks)  # fmt: skip
        out.append(Point(p.id, p.params, p.measures, p.checks,
                         {**p.extra, "sample_path": PRODUCTION}))  # fmt: skip
    return out


def ratio_table(timed: dict[str, dict[str, list[float]]]) -> dict[str, Interval]:
    """Each BSR mode's TTFT and restore_s over the whole plan's, paired by round, and the
    whole plan's TTFT over recomputing's."""
    whole = timed["W=0"]
    out = {
        f"{m.label}/{what}": paired_ratio_ci(timed[m.label][what], whole[what], SEED)
        for m in MODES
        if m.w > 0
        for what in ("ttft_s", "restore_s")
    }
    out["whole-plan/recompute"] = paired_ratio_ci(
        whole["ttft_s"], timed["recompute"]["ttft_s"], SEED
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds (median per mode)")
    ap.add_argument("--spec", type=Path, default=Path("ladders/cpu-e1.yaml"))
    ap.add_argument("--out", type=Path, default=None, help="stack folder (default: a temp dir)")
    ap.add_argument("--evidence", type=Path, default=Path("reports"), help="bench run under here")
    args = ap.parse_args()
    if args.repeat < 2:
        print("--repeat: 2 or more timed rounds (an interval needs them)", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)
    spec = ExperimentSpec.model_validate(read_yaml(args.spec))
    r = spec.restore
    print(
        f"# {args.spec}: tiny model, FS L2, L1 {spec.stack.lmcache.l1_size_bytes} B, "
        f"load_concurrency {r.load_concurrency}, checksum {r.checksum} ({r.checksum_algorithm})",
        flush=True,
    )
    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory(prefix="bsr-ttft-")
        run_dir = Path(tmp.name)
    else:
        run_dir = args.out
        run_dir.mkdir(parents=True, exist_ok=True)
    target: Any = make_target(spec, run_dir)
    prompt = Prompt(f"{spec.salt}-ttft", args.tokens)
    fields = ("ttft_s", "restore_s", "first_window_s")
    timed: dict[str, dict[str, list[float]]] = {m.label: {f: [] for f in fields} for m in MODES}
    windows: dict[str, list[dict[str, float]]] = {m.label: [] for m in MODES}
    peaks: dict[str, list[int | None]] = {m.label: [] for m in MODES}
    accuracy: dict[str, list[Check]] = {}
    recomputed: list[float] = []
    t0 = time.monotonic()
    result: dict[str, Any] = {}

    def restore(m: Mode, oracle: bool) -> tuple[Any, dict[str, float]]:
        c = target.client
        c.configure(
            window_chunks=m.w, admission_budget_chunks=m.b, readback=oracle,
            window_staging=m.staging,
        )  # fmt: skip
        target.window_chunks, target.readback = m.w, oracle  # measure() changes nothing
        before = c.status()
        got = target.measure(prompt, m.w, cold=False, oracle=oracle)
        after = c.status()
        if got.cached_tokens != got.expected_cached_tokens or got.restore_failures:
            raise SystemExit(
                f"{m.label}: cached {got.cached_tokens}/{got.expected_cached_tokens} tokens, "
                f"failures {got.restore_failures}"
            )
        return got, window_means(outcomes_since(before.recent_outcomes, after.recent_outcomes))

    def recompute(k: int) -> float:
        ids = prompt_ids(f"{spec.salt}-recompute-{k}", args.tokens, target.vocab)
        target.client.forget(wait_s=120.0)
        target.stack.forget_local()
        comp = target.stack.complete(ids, spec.max_tokens)
        if comp.cached_tokens:
            raise SystemExit(f"recompute prompt hit {comp.cached_tokens} cached tokens")
        return float(comp.ttft_s)

    def judge_accuracy(m: Mode, got: Any) -> list[Check]:
        out = [
            check(
                "canonical_output",
                got.output_sha256 == got.canonical_sha256,
                f"output {got.output_sha256} vs canonical {got.canonical_sha256}",
            )
        ]
        if m.w > 0:
            rb = got.readback or {}
            ok = rb.get("mismatches") == 0 and rb.get("windows_checked") == got.windows_done
            out.append(check("install_readback", ok, f"{rb.get('windows_checked')} of "
                             f"{got.windows_done} windows read back, {rb.get('mismatches')} "
                             f"mismatches"))  # fmt: skip
        return out

    def body(w: Any) -> tuple[dict[str, Any], list[Check]]:
        target.prepare([prompt])  # the vocabulary and the canonical output (no connector)
        target.deploy(spec.stack.lmcache.l1_size_bytes, spec.settings(4))
        w.set_stack(target.describe())
        target.store([prompt])
        print(
            f"# serving stack up and {args.tokens} tokens stored in "
            f"{time.monotonic() - t0:.0f}s; an accuracy pass, a warm-up and {args.repeat} "
            f"timed rounds of {', '.join(m.label for m in MODES)}",
            flush=True,
        )
        for kind, _k, order in rounds(len(MODES), args.repeat, 1):
            for i in order:
                m = MODES[i]
                if m.w < 0:
                    x = recompute(len(recomputed))  # a fresh salt every time
                    recomputed.append(x)
                    if kind is Pass.TIMED:
                        timed[m.label]["ttft_s"].append(x)
                    continue
                got, win = restore(m, kind.oracle)
                peaks[m.label].append(got.restore_pool_peak_bytes)
                if kind is Pass.ACCURACY:
                    accuracy[m.label] = judge_accuracy(m, got)
                    bad = [c for c in accuracy[m.label] if str(c.verdict) != "PASS"]
                    if bad:
                        raise SystemExit(f"{m.label} accuracy pass: {bad[0].detail}")
                if kind is not Pass.TIMED:
                    continue
                row = timed[m.label]
                row["ttft_s"].append(got.ttft_s or 0.0)
                row["restore_s"].append(got.restore_s or 0.0)
                if win:
                    row["first_window_s"].append(win["first_s"])
                    windows[m.label].append(win)
        for p in points(args.tokens, timed, peaks, accuracy):
            w.add_point(p)
        ratios = ratio_table(timed)
        result["ratios"] = ratios
        result["fixed"] = {
            s: fixed_costs(windows[f"W=4{sfx}"], windows[f"W=16{sfx}"])
            for s, sfx in (("direct", ""), ("prefetch", " prefetch"))
        }
        summary = {
            "tokens": args.tokens,
            "timed_rounds": args.repeat,
            "ratios": {k: v.as_list() + [v.estimate] for k, v in ratios.items()},
            "window_fixed_ms": {
                s: {ph: [iv.estimate, iv.lo, iv.hi] for ph, (iv, _, _) in f.items()}
                for s, f in result["fixed"].items()
            },
        }
        return summary, []

    def teardown() -> None:
        target.teardown()
        if tmp is not None:
            tmp.cleanup()

    verdict, evidence = run_bench(
        "ttft_restore", args.evidence, vars(args), {"kind": "serving"}, body, teardown
    )
    print(f"# evidence {evidence} ({verdict})", flush=True)
    print(f"# total {time.monotonic() - t0:.0f}s")
    if "ratios" not in result:
        print("ttft: no ratios (the run did not finish)")
        return 1
    print("# per-window fixed cost (a of a + b*bytes, W=4 vs W=16 windows), ms [95 % CI]:")
    for s, f in result["fixed"].items():
        said = "  ".join(f"{ph.removesuffix('_s')} {iv.text(3)}" for ph, (iv, _, _) in f.items())
        print(f"#   {s:8} {said}")
    for s, f in result["fixed"].items():
        said = "  ".join(f"{ph.removesuffix('_s')} {b.text(3)}" for ph, (_, b, _) in f.items())
        print(f"# per MiB of window bytes ({s}), ms: {said}")
    print(f"{'mode':14} {'ttft ms':>8} {'restore ms':>10} {'first win ms':>12}  timed ttft ms")
    for m in MODES:
        row = timed[m.label]

        def med(k: str, row: dict[str, list[float]] = row) -> str:
            return f"{1000 * statistics.median(row[k]):.1f}" if row[k] else "-"

        runs = " ".join(f"{1000 * x:.0f}" for x in row["ttft_s"])
        print(f"{m.label:14} {med('ttft_s'):>8} {med('restore_s'):>10} "
              f"{med('first_window_s'):>12}  [{runs}]")  # fmt: skip
    ratios = result["ratios"]
    fixed = result["fixed"]["direct"]["window"][0]
    print(f"restore_s W=4/whole-plan={ratios['W=4/restore_s'].text(3)} "
          f"W=16/whole-plan={ratios['W=16/restore_s'].text(3)}")  # fmt: skip
    print(f"ttft prefetch staging: W=4/whole-plan={ratios['W=4 prefetch/ttft_s'].text(3)} "
          f"W=16/whole-plan={ratios['W=16 prefetch/ttft_s'].text(3)} "
          f"window-fixed-ms={result['fixed']['prefetch']['window'][0].text(3)}; "
          f"whole-plan/recompute={ratios['whole-plan/recompute'].text(3)}")  # fmt: skip
    print(
        f"ttft W=4/whole-plan={ratios['W=4/ttft_s'].text(3)} "
        f"W=16/whole-plan={ratios['W=16/ttft_s'].text(3)} window-fixed-ms={fixed.text(3)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
