"""Predict before measuring: what the simulation says TempoKV gains over LMCache-DAX on a
flash tier with the given read paths, per rate, with the headroom (``fig6/predict.py``).
The tier's figures come from one of:

- ``--staging-mib-s S --demand-mib-s D``: an operator's own device (at the spec's scale: the
  flash-tier spec's MiB are the paper's GiB; bulk reads at S, 4 KiB demand misses at D);
- ``--fio EVIDENCE_DIR [--ratio R]``: the figures the live bench measured with fio (its
  ``evidence.json`` summary's ``device``), at its spec ratio R (default: the lowest);
- ``--probe``: fio now, on a tier of the spec's own (root: loop device, cgroups).

    python bench/tempokv/fig6_predict.py [SPEC.yaml] [RATES…] (--staging-mib-s S
        --demand-mib-s D | --fio DIR [--ratio R] | --probe) [--seeds N] [--cpu-engine]

Bad input exits 2 naming the flag; a probe whose tier cannot be made exits 3."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from fig6 import dax, device
from fig6.predict import CPU_ENGINE, predict, prediction_lines

from bsrctl.errors import StackFailed

MIB = 1 << 20


def from_evidence(path: Path, ratio: float | None) -> tuple[float, float]:
    """(staging, demand) bytes/s from a bench run's evidence (``evidence.json`` under it)."""
    doc = json.loads((path / "evidence.json" if path.is_dir() else path).read_text())
    dev = (doc.get("summary") or {}).get("device")
    if not dev:
        raise ValueError(f"{path}: no measured device in its summary (a --baseline dax run)")
    key = min(dev, key=float) if ratio is None else f"{ratio:g}"
    if key not in dev:
        raise ValueError(f"--ratio {ratio:g}: the run measured {sorted(dev)}")
    fig = dev[key]["figures"]
    return float(fig["staging_bytes_s"]), float(fig["demand_bytes_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("args", nargs="*", help="[SPEC.yaml] [RATES…] (requests per second)")
    ap.add_argument("--staging-mib-s", type=float, help="bulk reads (the spec's scale)")
    ap.add_argument("--demand-mib-s", type=float, help="4 KiB demand misses (the spec's scale)")
    ap.add_argument("--fio", type=Path, help="a fig6 --baseline dax run's evidence directory")
    ap.add_argument("--ratio", type=float, help="--fio: which measured ratio (default lowest)")
    ap.add_argument("--probe", action="store_true", help="measure a tier of the spec now")
    ap.add_argument("--seeds", type=int, default=6, help="output-length seeds per rate")
    ap.add_argument(
        "--cpu-engine",
        action="store_true",
        help="this CPU serving stack's engine (default: the simulation's H100)",
    )
    ns = ap.parse_args()
    given = [ns.staging_mib_s is not None or ns.demand_mib_s is not None, ns.fio is not None,
             ns.probe]  # fmt: skip
    if sum(given) != 1:
        ap.error("give one of --staging-mib-s/--demand-mib-s, --fio, --probe")
    if given[0] and not (ns.staging_mib_s and ns.demand_mib_s and ns.staging_mib_s > 0
                         and ns.demand_mib_s > 0):  # fmt: skip
        ap.error("--staging-mib-s and --demand-mib-s: give both, each > 0")
    if ns.seeds < 1:
        ap.error(f"--seeds {ns.seeds}: give 1 or more")
    read = dax.flash_spec_and_rates(ap, ns.args, "the prediction")
    if isinstance(read, int):
        return read
    path, spec, rates = read
    if given[0]:
        staging, demand = ns.staging_mib_s * MIB, ns.demand_mib_s * MIB
    elif ns.fio is not None:
        try:
            staging, demand = from_evidence(ns.fio, ns.ratio)
        except (OSError, ValueError) as e:
            print(f"error: --fio: {e}", file=sys.stderr)
            return 2
    else:
        r = spec.serving.fast_tier.demand_ratio
        try:
            got = device.measure_device(spec, [r], Path(tempfile.mkdtemp(prefix="tk-probe-")))
        except StackFailed as e:
            print(f"FAILURE: {e}", file=sys.stderr)
            return 3
        print("\n".join(device.device_lines(spec, got)))
        fig = got[r][0]
        staging, demand = fig.staging_bytes_s, fig.demand_bytes_s
    engine = CPU_ENGINE if ns.cpu_engine else (1.0, None)
    preds = predict(spec, rates, staging, demand, ns.seeds, engine)
    what = "this stack's CPU engine" if ns.cpu_engine else "the simulation's H100"
    print("\n".join(prediction_lines(preds, staging, demand, what)))
    at = " ".join(f"@{p.rate:g}={p.p95:.3g}" for p in preds)
    tput = " ".join(f"@{p.rate:g}={p.tput:.3g}" for p in preds)
    print(f"fig6-predict ratio={demand / staging:.4g} tput tempokv/lmcache-dax {tput} "
          f"p95 tempokv/lmcache-dax {at}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
