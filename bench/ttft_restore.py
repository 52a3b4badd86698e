"""TTFT restored from the FS L2 at W = 0, 4, 16 against recomputing, on the serving stack.

    PYTHONPATH=$PWD .venv/bin/python bench/ttft_restore.py [--tokens 16384] [--repeat 5]
        [--spec ladders/cpu-e1.yaml] [--out DIR] [--evidence reports]

The serving target of ``make demo`` (``make_target(spec, ...)``: vLLM CPU with the
tiny Llama, LMCache MP server with the BSR module, FS L2), one deployment. The prompt is
stored once into the FS L2; then each round measures, in turn:
  W=0 (whole plan)  stock lookup + whole-plan prefetch, through the module's pass-through
  W=4, W=16         BSR windows at B = W and at B = 2W (window j+1 fetched while j is
                    installed), switched over bsr.configure
  W=4 B=4 -rb       W = 4 with the install read-back off: what the read-back costs, side
                    by side (every other BSR mode reads back, as the default does)
  recompute         a prompt of the same length that no tier holds (a fresh salt per round)
Before each restore L1 and vLLM's prefix cache are emptied (``target.measure``), so only the
FS L2 can serve. TTFT is vLLM's own histogram delta. Medians over --repeat rounds.

Per BSR point it also prints where the retrieve's time went, per window (the core's
always-on timings, from the module's outcome records): fetch, wait, install, sync, read-back.

Evidence: a ``bench`` run under --evidence (``bsrctl.experiments.bench``): a point per mode
with every round's TTFT, restore time and first-window time as samples (median and 95 %
interval), the restore-pool peaks (``peak_identical`` FAILs when they move between rounds);
``bsrctl report | compare | verify`` take it. Its folder is printed before the table.

Last lines: each BSR mode's TTFT over the whole plan's (and the whole plan's over
recomputing), the median of the per-round ratios with its 95 % bootstrap interval
(``stats.paired_ratio_ci``), e.g. ``ttft W=4/whole-plan=1.21 [1.15, 1.27] W=16/whole-plan=…``
with B = 2W; the line before it gives B = W and the read-back's own share.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bsrctl.evidence.verdict import Check, Point, check
from bsrctl.experiments.bench import SEED, bench_point, run_bench
from bsrctl.experiments.restore.spec import ExperimentSpec
from bsrctl.prompts import prompt_ids
from bsrctl.spec_io import read_yaml
from bsrctl.stack.bsr_client import outcomes_since
from bsrctl.stack.selector import make_target
from bsrctl.stack.target import Prompt
from bsrctl.stats import paired_ratio_ci

# (W, B, read-back): B = W and pipelined B = 2W, read back as by default; W = 4 without it
MODES = ((0, 0, True), (4, 4, True), (4, 8, True), (16, 16, True), (16, 32, True), (4, 4, False))


def phases(outcomes: list[Any]) -> tuple[str, float | None]:
    """Per-window means (ms) over every BSR outcome of one request (both ranks), and the
    seconds from retrieve start to the first window installed (None: no BSR window)."""
    ws = [w for o in outcomes if o.mode == "bsr" for w in (o.window_phases or ())]
    if not ws:
        return "", None
    n = len(ws)

    def mean(k: str) -> float:
        return 1000 * sum(w[k] for w in ws) / n

    first = min(w["installed_at_s"] for w in ws if w["index"] == 0)
    return (
        f"windows={n} fetch {mean('fetch_s'):.2f} wait {mean('wait_s'):.2f} "
        f"install {mean('install_s'):.2f} sync {mean('sync_s'):.2f} "
        f"readback {sum(w.get('readback_s') or 0.0 for w in ws) * 1000 / n:.2f} "
        f"admit {mean('admit_wait_s'):.2f} ms/window; first window in {1000 * first:.1f} ms"
    ), first


Mode = tuple[int, int, bool]


def label(w: int, b: int, readback: bool) -> str:
    return f"W={w}" + (f" B={b}" if w else "") + ("" if readback or not w else " -rb")


def points(
    labels: dict[Mode, str], tokens: int, runs: dict[str, dict[str, list[Any]]]
) -> tuple[list[Point], dict[str, str]]:
    """The bench's evidence: a point per mode (samples in round order), and each BSR mode's
    TTFT / the whole plan's over the paired rounds, with its 95 % interval (the summary)."""
    out = []
    for (w, b, rb), k in [*labels.items(), ((-1, 0, False), "recompute")]:
        r = runs[k]
        peaks = sorted(set(r["peak"]), key=str)
        checks = [check("peak_identical", len(peaks) == 1, f"restore-pool peak per round "
                        f"{r['peak']} B")] if r["peak"] else []  # fmt: skip
        firsts = [x for x in r["first_s"] if x is not None]
        samples = {"ttft_s": r["ttft_s"], "restore_s": r["restore_s"], "first_window_s": firsts}
        samples = {name: v for name, v in samples.items() if v}  # what this mode measured
        measures = {"restore_pool_peak_bytes": peaks[0] if len(peaks) == 1 else None}
        params = {
            "tokens": tokens,
            "window_chunks": max(w, 0),
            "budget_chunks": b,
            "mode": k,
            "readback": rb and w > 0,
        }
        out.append(bench_point(f"ttft/{k}", params, samples, measures, checks))
    whole = runs["W=0"]["ttft_s"]
    ratios = {
        k: paired_ratio_ci(runs[k]["ttft_s"], whole, SEED).text(3)
        for (w, _b, _rb), k in labels.items()
        if w
    }
    ratios["whole-plan/recompute"] = paired_ratio_ci(whole, runs["recompute"]["ttft_s"], SEED).text(
        3
    )
    return out, ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=5, help="rounds (median per mode)")
    ap.add_argument("--spec", type=Path, default=Path("ladders/cpu-e1.yaml"))
    ap.add_argument(
        "--load-concurrency", type=int, default=0, help="FS loads per rank (0: the spec's)"
    )
    ap.add_argument("--out", type=Path, default=None, help="stack folder (default: a temp dir)")
    ap.add_argument("--evidence", type=Path, default=Path("reports"), help="bench run under here")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    spec = ExperimentSpec.model_validate(read_yaml(args.spec))
    if args.load_concurrency:
        tuning = spec.restore.model_copy(update={"load_concurrency": args.load_concurrency})
        spec = spec.model_copy(update={"restore": tuning})
    print(
        f"# {args.spec}: tiny model, FS L2, L1 {spec.stack.lmcache.l1_size_bytes} B, "
        f"load_concurrency {spec.restore.load_concurrency}, checksum {spec.restore.checksum}",
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
    labels = {m: label(*m) for m in MODES}
    keys = ("ttft_s", "restore_s", "first_s", "peak", "note")
    runs: dict[str, dict[str, list[Any]]] = {
        k: {f: [] for f in keys} for k in [*labels.values(), "recompute"]
    }
    ttft = {k: r["ttft_s"] for k, r in runs.items()}
    restore_s = {k: r["restore_s"] for k, r in runs.items() if k != "recompute"}
    notes = {k: r["note"] for k, r in runs.items() if k != "recompute"}
    t0 = time.monotonic()
    result: dict[str, dict[str, str]] = {}

    def body(_w: Any) -> tuple[dict[str, Any], list[Check]]:
        from bsrctl.stack.model import prepare_model

        target.vocab = prepare_model(spec.stack.vllm).vocab
        target.deploy(spec.stack.lmcache.l1_size_bytes, spec.settings(4))
        _w.set_stack(target.describe())
        target.store([prompt])
        print(
            f"# serving stack up and {args.tokens} tokens stored in "
            f"{time.monotonic() - t0:.0f}s; {args.repeat} rounds of W=0, 4, 16, recompute",
            flush=True,
        )
        for r in range(args.repeat):
            for w, b, rb in MODES:
                if w:  # B per point (the deployment's B is W's default)
                    target.client.configure(window_chunks=w, admission_budget_chunks=b, readback=rb)
                    target.window_chunks = w
                before = target.client.status()
                m = target.measure(prompt, w, cold=False)
                after = target.client.status()
                if m.cached_tokens != m.expected_cached_tokens or m.restore_failures:
                    raise SystemExit(
                        f"W={w}: cached {m.cached_tokens}/{m.expected_cached_tokens} tokens, "
                        f"failures {m.restore_failures}"
                    )
                run = runs[labels[w, b, rb]]
                run["ttft_s"].append(m.ttft_s or 0.0)
                run["restore_s"].append(m.restore_s or 0.0)
                run["peak"].append(m.restore_pool_peak_bytes)
                note, first = phases(outcomes_since(before.recent_outcomes, after.recent_outcomes))
                run["note"].append(note)
                run["first_s"].append(first)
            ids = prompt_ids(f"{spec.salt}-recompute-{r}", args.tokens, target.vocab)
            target.client.forget(wait_s=120.0)
            target.stack.forget_local()
            comp = target.stack.complete(ids, spec.max_tokens)
            if comp.cached_tokens:
                raise SystemExit(f"recompute prompt hit {comp.cached_tokens} cached tokens")
            ttft["recompute"].append(comp.ttft_s)
        pts, ratios = points(labels, args.tokens, runs)
        for p in pts:
            _w.add_point(p)
        result["ratios"] = ratios
        return {"tokens": args.tokens, "rounds": args.repeat, "ttft_vs_whole_plan": ratios}, []

    def teardown() -> None:
        target.teardown()
        if tmp is not None:
            tmp.cleanup()

    verdict, evidence = run_bench(
        "ttft_restore", args.evidence, vars(args), {"kind": "serving"}, body, teardown
    )
    print(f"# evidence {evidence} ({verdict})", flush=True)
    print(f"{'mode':12} {'ttft s':>8} {'restore s':>9}  runs ttft s")
    med = {k: statistics.median(v) for k, v in ttft.items()}
    for k, v in ttft.items():
        rs = f"{statistics.median(restore_s[k]):9.3f}" if k in restore_s else f"{'':9}"
        print(f"{k:12} {med[k]:8.3f} {rs}  [{' '.join(f'{x:.3f}' for x in v)}]")
        if notes.get(k) and notes[k][-1]:
            print(f"{'':4}last round: {notes[k][-1]}")
    print(f"# total {time.monotonic() - t0:.0f}s")
    ratios = result.get("ratios")
    if ratios is None:
        print("ttft: no ratios (the run did not finish)")
        return 1
    print(f"ttft B=W: W=4/whole-plan={ratios['W=4 B=4']} W=16/whole-plan={ratios['W=16 B=16']} "
          f"W=4 no read-back/whole-plan={ratios['W=4 B=4 -rb']}")  # fmt: skip
    print(f"ttft W=4/whole-plan={ratios['W=4 B=8']} W=16/whole-plan={ratios['W=16 B=32']} "
          f"whole-plan/recompute={ratios['whole-plan/recompute']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
