"""Restore at the tier's limit: BSR against the best raw reader of each tier, in one run.

    PYTHONPATH=$PWD .venv/bin/python bench/restore_bandwidth.py \\
        [--tokens 8192 65536] [--windows 8] [--repeat 3] [--conc 4] [--conc-sweep 1 2 4 8] \\
        [--tiers fs mooncake] [--root DIR]

Paper geometry (DeepSeek-V4-Flash MTP-off registration, TP = 2, 16,408,576 B per chunk per
rank), restored through LMCache's real StorageManager (one per rank, null destination: no
H2D copy exists here, install = count bytes) from two tiers:

FS L2 (files under --root, O_DIRECT, page cache dropped before every pass):
  raw k=1,2,4,8   k threads reading the prefix's L2 files with O_DIRECT, one file at a time
                  each
  fio             fio over the same files: O_DIRECT, one object per read, each file in turn,
                  iodepth 1-32 on libaio and io_uring (the disk's limit is the best of them)
  whole-plan      W = 0: stock single-shot locked prefetch (L1 sized to fit), if RAM allows
  bsr B=W, B=2W   BSR windows (B = 2W: window j+1 fetched while j is installed), in their
                  own deployment with L1 = 2W*c + 64 MiB (what BSR is deployed with); the
                  adapter verifies each object's xxh3_128 sidecar at load (restore.checksum)
  no checksum     BSR B = 2W at the first W again, the same files, nothing verified: the
                  integrity's cost
  conc sweep      BSR B = 2W over the FS adapter with load_concurrency 1, 2, 4, 8 (one
                  deployment each, same files), with the adapter's read service time
                  (smallest size only)
Mooncake (master + storage node in a private network namespace; this script re-runs itself
inside it for the measurements):
  client modes    the same objects through the store's own client: batch_get_into of one
                  window's objects at a time; each rank's client (as BSR has) batching its
                  own objects, both at once; k threads of get_into (k = 1, 2, 4)
  bsr B=W, B=2W   BSR over LMCache with bsrctl's Mooncake adapter

Every mode of a tier and size is measured round-robin, --repeat rounds (median per mode),
each round starting one mode later, so drift of the shared virtual disk hits all alike.
Also: probe-only lookup of the whole prefix against the stock lookup-and-lock of the same
keys, and the time from retrieve start to the first window installed, with the per-window
phases (fetch, wait, install, sync). The Mooncake worker also compares the adapter's
load_workers (batches in flight per rank) 1 and 2 at B = W and B = 2W.

Evidence: a ``bench`` run under --evidence (default reports/): a point per tier, size and
mode with every round's pass seconds and time to the first window as samples (median, 95 %
interval), the median pass's rate and the staging peak (``peak_identical`` FAILs when it
moves between rounds); its folder is printed before the last lines.

Last line: ``fs: bsr/best-raw=X.XX bsr/whole-plan=Y.YY bsr/fio@8192=F.FF [lo, hi]
bsr/fio@65536=… checksum/no-checksum=K.KK [lo, hi] mooncake: bsr/best-raw=Z.ZZ
peak_bytes=N`` for the first W, B = 2W, at the largest size but bsr/fio, given at every
size: the median over rounds of BSR's rate over the best fio mode's in the same round, with
its 95 % bootstrap interval (checksum/no-checksum: the same, of the goal row with its
checksums verified over it without); N is the largest size's staging peak per rank (B·c
exactly when the restore pool is flat). A fio mode that fails is
dropped with one line naming its job and fio's message; the others go on.

The parts live in bench/bandwidth/ (by tier: ``fs``, ``mooncake`` and ``mooncake_worker``; the
shared ``common``, ``stacks``, ``raw``, ``summary``); every stack is deployed the one way
storage stacks are, ``StorageTarget.deploy``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from bandwidth.common import TierResult
from bandwidth.fio import DEPTHS
from bandwidth.fs import fs_tier
from bandwidth.mooncake import mooncake_tier
from bandwidth.mooncake_worker import mooncake_worker
from bandwidth.stacks import registration
from bandwidth.summary import goal_label, last_line, tier_points

from bsrctl.evidence import EvidenceWriter
from bsrctl.evidence.verdict import Check
from bsrctl.experiments.bench import run_bench


def say(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=[8192, 65536],
        help="prefix sizes (256-token chunks); 64K is ~8.4 GB of files",
    )
    ap.add_argument("--windows", type=int, nargs="+", default=[8], help="W values (chunks)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (median per mode)")
    ap.add_argument("--conc", type=int, default=4, help="FS adapter load_concurrency per rank")
    ap.add_argument(
        "--conc-sweep",
        type=int,
        nargs="*",
        default=[1, 2, 4, 8],
        help="FS load_concurrency values to compare at B = 2W (none: skip)",
    )
    ap.add_argument(
        "--fio-depths",
        type=int,
        nargs="*",
        default=list(DEPTHS),
        help="fio queue depths over the FS tier's files, libaio and io_uring (none: no fio)",
    )
    ap.add_argument("--tiers", nargs="+", default=["fs", "mooncake"], choices=["fs", "mooncake"])
    ap.add_argument("--root", default="/var/tmp", help="where L2 files go (a real disk)")
    ap.add_argument("--mc-timeout-s", type=float, default=400.0)
    ap.add_argument(
        "--mc-parallel",
        type=int,
        nargs="+",
        default=[1, 2, 4],
        help="Mooncake baseline: threads of get_into",
    )
    ap.add_argument(
        "--mc-whole-max-gib",
        type=float,
        default=2.0,
        help="Mooncake whole-plan only up to this prefix size (RAM: store + L1)",
    )
    ap.add_argument(
        "--mc-load-workers",
        type=int,
        default=1,
        help="Mooncake adapter load_workers per rank (the stacks' load_concurrency, 1)",
    )
    ap.add_argument(
        "--mc-load-workers-sweep",
        type=int,
        nargs="*",
        default=[1, 2],
        help="Mooncake load_workers values compared at the first W (none: skip)",
    )
    ap.add_argument("--evidence", default="reports", help="the bench run goes under here")
    ap.add_argument("--mooncake-worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    if args.mooncake_worker:
        return mooncake_worker(args, say)
    reg = registration()
    c = reg.bytes_per_chunk
    say(
        f"# {reg.model}: c={c} B/chunk/rank, TP={reg.tp_size}, sizes {args.tokens} tokens, "
        f"W {args.windows}; null destination; reads O_DIRECT; {os.cpu_count()} CPUs"
    )
    t0 = time.monotonic()
    fs: list[TierResult] = []
    mc: list[TierResult] = []

    def body(writer: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        if "fs" in args.tiers:
            fs.extend(fs_tier(args, t, say) for t in args.tokens)
        if "mooncake" in args.tiers:
            mc.extend(mooncake_tier(args, say))
        for point in tier_points("fs", fs) + tier_points("mooncake", mc):
            writer.add_point(point)
        return {"last_line": last_line(fs, mc, args.windows[0])}, []

    stack = {"kind": "storage", "registration": reg.to_dict()}
    verdict, run_dir = run_bench("restore_bandwidth", Path(args.evidence), vars(args), stack, body)
    say(f"# evidence {run_dir} ({verdict})")
    w = args.windows[0]
    goal = f"{goal_label(w)} at {max(args.tokens)} tokens"
    say(f"# total {time.monotonic() - t0:.0f}s; goal rows: {goal}")
    say(f"# B*c = {2 * w * c} B per rank")
    print(last_line(fs, mc, w))
    return 0


if __name__ == "__main__":
    sys.exit(main())
