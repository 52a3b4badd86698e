"""LMCache 0.5.6's FS L2 lookup against bsrctl's: the same existence checks of one prefix's
keys, the stock ``FSL2Adapter`` awaiting ``aiofiles.os.path.exists`` key by key (one round
trip through the event loop's default executor per key) and ``BsrFSL2Adapter`` making them
in one round trip per task. Real adapters, real files, in process; side by side in rotated
rounds.

    PYTHONPATH=$PWD .venv/bin/python bench/fs_lookup.py [--rounds 9] [--keys 64]
        [--evidence reports]

Every lookup runs twice per round: on an idle process, and beside one thread running pure
Python (``busy``), as the LMCache server's other threads do during a restore: each executor
round trip then also waits for the GIL. A lookup is timed from submit to its result (the
adapter's lookup event fd, as LMCache's controllers wait for it). A 16K-token prefix of the
tiny Llama is 64 keys, the probe's lookup; a W = 4 window's is 4. Both adapters must find
the same keys (every other one exists), else exit 1.

Evidence: a ``bench`` run (a point per adapter and load, its per-round seconds as samples).
Last line: ``fs lookup stock/bsr idle=R [lo, hi] busy=R [lo, hi] per-lookup ms ...``."""

from __future__ import annotations

import argparse
import hashlib
import select
import statistics
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2Adapter, FSL2AdapterConfig

from bsrctl.experiments.bench import SEED, bench_point, run_bench
from bsrctl.stats import paired_ratio_ci
from bsrkv.lmcache_ext.adapters.fs import BsrFSL2Adapter, BsrFSL2AdapterConfig

LOADS = ("idle", "busy")


def keys_for(n: int) -> list[ObjectKey]:
    return [
        ObjectKey(chunk_hash=hashlib.sha256(f"fs-lookup:{i}".encode()).digest()[:16],
                  model_name="bench-fs-lookup", kv_rank=0)
        for i in range(n)
    ]  # fmt: skip


def lookup(adapter: Any, keys: list[ObjectKey]) -> tuple[float, list[int]]:
    """Seconds from submit to result, and the hit indices."""
    poller = select.poll()
    poller.register(adapter.get_lookup_and_lock_event_fd(), select.POLLIN)
    t0 = time.perf_counter()
    task = adapter.submit_lookup_and_lock_task(keys, {})
    while (got := adapter.query_lookup_and_lock_result(task)) is None:
        poller.poll(100)
    dt = time.perf_counter() - t0
    hits = got.get_indices_list()
    adapter.submit_unlock([keys[i] for i in hits])
    return dt, hits


class Busy:
    """One thread running pure Python (it holds the GIL between switch intervals)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Busy:
        def spin() -> None:
            x = 0
            while not self._stop.is_set():
                x = (x + 1) % 1_000_003

        self._thread = threading.Thread(target=spin, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--evidence", type=Path, default=Path("reports"))
    args = ap.parse_args()
    for name in ("rounds", "keys"):
        if getattr(args, name) < 1:
            print(f"--{name} must be >= 1", file=sys.stderr)
            return 2
    tmp = tempfile.TemporaryDirectory(prefix="bsr-fs-lookup-")
    base = Path(tmp.name)
    adapters = {
        "stock": FSL2Adapter(FSL2AdapterConfig(base_path=str(base))),
        "bsr": BsrFSL2Adapter(BsrFSL2AdapterConfig(base_path=str(base))),
    }
    keys = keys_for(args.keys)
    for i, key in enumerate(keys):
        if i % 2 == 0:  # every other key exists: misses are checked too
            adapters["stock"]._key_to_path(key).write_bytes(b"\0" * 4096)  # noqa: SLF001
    want = list(range(0, args.keys, 2))
    secs: dict[tuple[str, str], list[float]] = {(a, ld): [] for a in adapters for ld in LOADS}

    def body(w: Any) -> tuple[dict[str, Any], list[Any]]:
        for r in range(args.rounds):
            for load in LOADS:
                order = list(adapters) if r % 2 == 0 else list(adapters)[::-1]
                with Busy() if load == "busy" else nullcontext():
                    for name in order:
                        dt, hits = lookup(adapters[name], keys)
                        if hits != want:
                            raise SystemExit(f"{name}: hits {hits[:8]}..., expected {want[:8]}...")
                        secs[name, load].append(dt)
        for (name, load), xs in secs.items():
            params = {"adapter": name, "load": load, "keys": args.keys}
            w.add_point(bench_point(f"fs-lookup/{name}/{load}", params, {"lookup_s": xs}))
        return {"rounds": args.rounds, "keys": args.keys}, []

    def teardown() -> None:
        for a in adapters.values():
            a.close()
        tmp.cleanup()

    verdict, evidence = run_bench("fs_lookup", args.evidence, vars(args), {"kind": "storage"},
                                  body, teardown)  # fmt: skip
    print(f"# evidence {evidence} ({verdict})")
    ms = {k: 1000 * statistics.median(v) for k, v in secs.items()}
    ratios = {ld: paired_ratio_ci(secs["stock", ld], secs["bsr", ld], SEED).text(3) for ld in LOADS}
    per = " ".join(f"{a}/{ld}={ms[a, ld]:.2f}" for a in adapters for ld in LOADS)
    print(f"fs lookup stock/bsr idle={ratios['idle']} busy={ratios['busy']} per-lookup ms {per}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
