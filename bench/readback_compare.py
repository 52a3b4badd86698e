"""What the install read-back's comparison costs per chunk: two blake2b-128 digests (the
read-back before this bench) against the direct byte compare it now makes
(``bsrkv.lmcache_ext.bsr.readback.same_bytes``), over LMCache memory objects of one chunk of
the tiny Llama (262,144 B), side by side in rotated rounds.

    PYTHONPATH=$PWD .venv/bin/python bench/readback_compare.py [--rounds 9] [--chunks 64]
        [--chunk-bytes 262144] [--evidence reports]

A round times each way over ``--chunks`` object pairs (a 16K-token prefix is 64 chunks);
the order of the two ways alternates between rounds so drift hits both. Evidence: a
``bench`` run (a point per way, its per-round seconds as samples). Last line:
``readback compare digest/direct=R [lo, hi] per-chunk ms digest=… direct=…``."""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from chunk_args import chunk_args
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

from bsrctl.experiments.bench import SEED, bench_point, run_bench
from bsrctl.stats import paired_ratio_ci
from bsrkv.lmcache_ext.bsr.readback import same_bytes


def memory_obj(raw: torch.Tensor) -> TensorMemoryObj:
    size = raw.numel()
    meta = MemoryObjMetadata(shape=torch.Size([size]), dtype=torch.uint8, address=0,
                             phy_size=size, ref_count=1)  # fmt: skip
    return TensorMemoryObj(raw, meta, parent_allocator=None)


def digests_equal(a: Any, b: Any) -> bool:
    """The comparison the read-back made before: blake2b-128 of each side."""
    da = hashlib.blake2b(a.byte_array, digest_size=16).digest()
    return da == hashlib.blake2b(b.byte_array, digest_size=16).digest()


WAYS: dict[str, Callable[[Any, Any], bool]] = {"digest": digests_equal, "direct": same_bytes}


def main() -> int:
    args = chunk_args(__doc__.split("\n\n")[0])
    if args is None:
        return 2
    gen = torch.Generator().manual_seed(SEED)
    staged = [torch.randint(0, 256, (args.chunk_bytes,), dtype=torch.uint8, generator=gen)
              for _ in range(args.chunks)]  # fmt: skip
    pairs = [(memory_obj(s), memory_obj(s.clone())) for s in staged]
    secs: dict[str, list[float]] = {w: [] for w in WAYS}

    def body(w: Any) -> tuple[dict[str, Any], list[Any]]:
        for r in range(args.rounds):
            for way in list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]:
                f = WAYS[way]
                t0 = time.perf_counter()
                same = all(f(a, b) for a, b in pairs)
                secs[way].append(time.perf_counter() - t0)
                if not same:
                    raise SystemExit(f"{way}: equal objects compared unequal")
        for way, xs in secs.items():
            w.add_point(bench_point(f"readback/{way}", {"way": way, "chunks": args.chunks,
                                    "chunk_bytes": args.chunk_bytes}, {"round_s": xs}))  # fmt: skip
        return {"rounds": args.rounds}, []

    stack = {"kind": "storage"}
    verdict, evidence = run_bench("readback_compare", args.evidence, vars(args), stack, body)
    print(f"# evidence {evidence} ({verdict})")
    per = {w: 1000 * statistics.median(xs) / args.chunks for w, xs in secs.items()}
    ratio = paired_ratio_ci(secs["digest"], secs["direct"], SEED)
    print(f"readback compare digest/direct={ratio.text(3)} per-chunk ms "
          f"digest={per['digest']:.3f} direct={per['direct']:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
