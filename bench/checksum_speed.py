"""What an L2 object's integrity check costs: XXH3-128 and CRC32C (the candidates made for
integrity at memory speed) against sha256 (the earlier default), over LMCache memory
objects of one chunk of the tiny Llama (262,144 B), side by side in rotated rounds.

    PYTHONPATH=$PWD .venv/bin/python bench/checksum_speed.py [--rounds 9] [--chunks 64]
        [--chunk-bytes 262144] [--evidence reports]

A round hashes ``--chunks`` objects (a 16K-token prefix is 64 chunks) with each algorithm,
the order rotated between rounds so drift hits all alike. The buffers are what the FS
adapter hashes: each object's ``byte_array`` (a writable view of L1). CRC32C is the
``crc32c`` package (SSE4.2 where the CPU has it; ``google-crc32c`` takes only read-only
buffers, so it would copy every object first). Evidence: a ``bench`` run (a point per
algorithm, its per-round seconds as samples).

Last line: each algorithm's MiB/s (median, 95 % interval) and sha256's and CRC32C's time over
XXH3-128's, e.g. ``checksum MiB/s xxh3_128=9800 [9100, 10200] crc32c=… sha256=…
sha256/xxh3_128=11.2 [10.8, 12] crc32c/xxh3_128=2.7 [2.5, 2.9]``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import crc32c
import torch
from chunk_args import chunk_args
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

from bsrctl.experiments.bench import SEED, bench_point, run_bench
from bsrctl.stats import median_ci, paired_ratio_ci
from bsrkv.lmcache_ext.adapters.checksum import Checksum

ALGORITHMS: dict[str, Callable[[Any], Any]] = {
    "xxh3_128": Checksum("xxh3_128").hexdigest,
    "crc32c": crc32c.crc32c,
    "sha256": Checksum("sha256").hexdigest,
}


def memory_obj(raw: torch.Tensor) -> TensorMemoryObj:
    size = raw.numel()
    meta = MemoryObjMetadata(shape=torch.Size([size]), dtype=torch.uint8, address=0,
                             phy_size=size, ref_count=1)  # fmt: skip
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def main() -> int:
    args = chunk_args(__doc__.split("\n\n")[0])
    if args is None:
        return 2
    gen = torch.Generator().manual_seed(SEED)
    objs = [memory_obj(torch.randint(0, 256, (args.chunk_bytes,), dtype=torch.uint8,
                                     generator=gen)) for _ in range(args.chunks)]  # fmt: skip
    names = list(ALGORITHMS)
    secs: dict[str, list[float]] = {a: [] for a in names}
    mib = args.chunks * args.chunk_bytes / 2**20

    def body(w: Any) -> tuple[dict[str, Any], list[Any]]:
        for r in range(args.rounds):
            for a in names[r % len(names) :] + names[: r % len(names)]:
                f = ALGORITHMS[a]
                t0 = time.perf_counter()
                for o in objs:
                    f(o.byte_array)
                secs[a].append(time.perf_counter() - t0)
        for a, xs in secs.items():
            params = {"algorithm": a, "chunks": args.chunks, "chunk_bytes": args.chunk_bytes}
            w.add_point(bench_point(f"checksum/{a}", params, {"round_s": xs}))
        return {"rounds": args.rounds, "mib_per_round": mib}, []

    stack = {"kind": "storage"}
    verdict, evidence = run_bench("checksum_speed", args.evidence, vars(args), stack, body)
    print(f"# evidence {evidence} ({verdict})")
    rates = {}
    for a, xs in secs.items():
        iv = median_ci([mib / x for x in xs], SEED)
        rates[a] = f"{iv.estimate:.0f} [{iv.lo:.0f}, {iv.hi:.0f}]"
        per = 1000 * statistics.median(xs) / args.chunks
        print(f"{a:9} {rates[a]:>22} MiB/s   {per:.4f} ms per {args.chunk_bytes} B object")
    vs = {a: paired_ratio_ci(secs[a], secs["xxh3_128"], SEED).text(3) for a in ("sha256", "crc32c")}
    print("checksum MiB/s " + " ".join(f"{a}={r}" for a, r in rates.items())
          + f" sha256/xxh3_128={vs['sha256']} crc32c/xxh3_128={vs['crc32c']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
