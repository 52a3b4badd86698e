"""BSR's restore core with a CUDA destination: windowed H2D against the whole plan, one run.

    PYTHONPATH=$PWD python bench/restore_gpu.py [--tokens 8192 65536] [--windows 8 32]
        [--repeat 5]

Imports only the pure core (``bsrkv.restore``, ``bsrctl.registration``: standard library
only) and torch, so it runs where PyTorch has CUDA and there is no vLLM or LMCache (Python
3.12 is fine). Without a CUDA device it says so and exits 0: the figure then does not exist.

What runs, at paper geometry (16,408,576 B per chunk per rank, three object groups, TP 2):
- the tier: every object of the prefix in pinned host memory (an L1 already holding the
  prefix: staging is a reference, so what is measured is the install into the GPU);
- the destination: a paged KV pool on the GPU per (rank, group), blocks assigned to chunks
  through a shuffled block table; ``install`` issues one ``copy_(non_blocking=True)`` per
  object on a side stream, ``sync`` synchronises that stream (what the core calls after every
  window);
- h2d whole plan: the same copies without the core, one sync at the end (the H2D limit);
- W = 0 (the core's whole-plan path) and BSR W = 8 and 32, B = W and B = 2W.
Every installed block is checked against its source after the last round (sampled bytes).

Last line: ``gpu: bsr W=32/whole-plan=X.XX h2d=G.GG GiB/s`` at the largest size, B = 2W
(goal X >= 0.9).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from bsrctl.registration.dsv4 import dsv4_flash_mtp_off
from bsrkv.restore import (
    BoundedRestorer,
    RestoreConfig,
    RestoreRequest,
    RowId,
    RowKeys,
    StageResult,
    Window,
    confirm_plan,
)

GIB = 1 << 30


class PinnedTier:
    """RestoreStorage whose objects already sit in pinned host memory (key -> tensor)."""

    def __init__(self, objects: Mapping[tuple[int, int, int], Any]) -> None:
        self.objects = objects  # (rank, group, chunk) -> pinned uint8 tensor

    def probe(self, request: RestoreRequest[Any]) -> list[list[bool]]:
        return [[k in self.objects for k in r.keys] for r in request.rows]

    def stage(self, request: RestoreRequest[Any], window: Window) -> Any:
        s, e = window.chunk_start, window.chunk_stop
        return {r.row: [self.objects[k] for k in r.keys[s:e]] for r in request.rows}

    def wait(self, ticket: Any, timeout_s: float) -> StageResult:
        hits = tuple(tuple(True for _ in objs) for objs in ticket.values())
        return StageResult(hits=hits, staged_bytes_by_rank={})

    @contextmanager
    def read(self, ticket: Any, num_chunks: int) -> Any:
        yield {row: objs[:num_chunks] for row, objs in ticket.items()}

    def release(self, ticket: Any) -> None:
        return None


class CudaPagedPool:
    """RestoreDestination: a paged KV pool on the GPU per (rank, group)."""

    def __init__(self, torch: Any, rows: Sequence[RowKeys[Any]], n: int, seed: int) -> None:
        self.torch = torch
        self.stream = torch.cuda.Stream()
        rng = random.Random(seed)
        self.pool = {}
        self.table = {}
        for r in rows:
            self.pool[r.row] = torch.empty((n, r.chunk_bytes), dtype=torch.uint8, device="cuda")
            blocks = list(range(n))
            rng.shuffle(blocks)
            self.table[r.row] = blocks
        self.invalid = False

    def install(
        self, request_id: str, window: Window, objects: Mapping[RowId, Sequence[Any]], n: int
    ) -> int:
        total = 0
        with self.torch.cuda.stream(self.stream):
            for row, objs in objects.items():
                pool, table = self.pool[row], self.table[row]
                for i in range(n):
                    pool[table[window.chunk_start + i]].copy_(objs[i], non_blocking=True)
                    total += objs[i].numel()
        return total

    def sync(self, request_id: str) -> None:
        self.stream.synchronize()

    def mark_invalid(self, request_id: str) -> None:
        self.invalid = True


def measure_size(torch: Any, reg: Any, tokens: int, args: argparse.Namespace) -> dict[str, float]:
    """Every mode at one prefix size, round-robin; bytes per second per mode."""
    n = reg.num_chunks(tokens)
    objects = {}
    for rank in range(reg.tp_size):
        for g in reg.groups:
            size = reg.group_bytes_per_chunk(g.index)
            for i in range(n):
                t = torch.empty(size, dtype=torch.uint8, pin_memory=True)
                t.fill_((rank * 131 + g.index * 17 + i) % 251)
                objects[(rank, g.index, i)] = t
    rows = tuple(
        RowKeys(
            RowId(rank, g.index),
            tuple((rank, g.index, i) for i in range(n)),
            reg.group_bytes_per_chunk(g.index),
        )
        for rank in range(reg.tp_size)
        for g in reg.groups
    )
    request = RestoreRequest("gpu-bench", rows, reg.chunk_tokens)
    tier = PinnedTier(objects)
    dest = CudaPagedPool(torch, rows, n, seed=tokens)
    nbytes = n * reg.bytes_per_chunk * reg.tp_size

    def h2d() -> float:
        torch.cuda.synchronize()
        t0 = time.monotonic()
        dest.install("raw", Window(0, 0, n), {r.row: [objects[k] for k in r.keys] for r in rows}, n)
        dest.sync("raw")
        return time.monotonic() - t0

    def core(w: int, b: int) -> tuple[float, float | None]:
        restorer = BoundedRestorer(tier, RestoreConfig(w, b, window_timeout_s=60.0))
        plan = confirm_plan(request, tier.probe(request))
        torch.cuda.synchronize()
        t0 = time.monotonic()
        out = restorer.restore(plan, dest)
        dt = time.monotonic() - t0
        if not out.ok or out.cached_chunks != n:
            raise SystemExit(f"restore W={w} B={b} failed: {out.detail}")
        return dt, out.first_install_s

    modes: list[tuple[str, Any]] = [("h2d whole plan (no core)", lambda: (h2d(), None))]
    modes.append(("whole-plan (W=0)", lambda: core(0, 0)))
    for w in args.windows:
        for b in (w, 2 * w):
            modes.append((f"bsr W={w} B={b}", lambda w=w, b=b: core(w, b)))
    runs: dict[str, list[tuple[float, float | None]]] = {m: [] for m, _ in modes}
    for _label, fn in modes:  # warm-up: allocator, first-touch, stream
        fn()
    for _ in range(args.repeat):
        for label, fn in modes:
            runs[label].append(fn())
    # check every block against its source (first and last bytes of each object)
    for r in rows:
        for i in range(n):
            got = dest.pool[r.row][dest.table[r.row][i]]
            want = objects[r.keys[i]]
            if got[0].item() != want[0].item() or got[-1].item() != want[-1].item():
                raise SystemExit(f"block of {r.row} chunk {i} not its source bytes")
    print(f"## {tokens} tokens: N={n} chunks, {nbytes / GIB:.2f} GiB H2D per restore")
    print(f"{'mode':28} {'s':>8} {'GiB/s':>7} {'first ms':>9}  runs GiB/s")
    rate = {}
    for label, _fn in modes:
        s = statistics.median(x[0] for x in runs[label])
        firsts = [x[1] for x in runs[label] if x[1] is not None]
        first = f"{1000 * statistics.median(firsts):9.2f}" if firsts else f"{'':9}"
        rate[label] = nbytes / s
        each = " ".join(f"{nbytes / x[0] / GIB:.1f}" for x in runs[label])
        print(f"{label:28} {s:8.4f} {nbytes / s / GIB:7.2f} {first}  [{each}]")
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 65536])
    ap.add_argument("--windows", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--repeat", type=int, default=5, help="rounds (median per mode)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"restore_gpu: no torch ({e}); no figure. Exit 0.")
        return 0
    if not torch.cuda.is_available():
        print("restore_gpu: no CUDA device here; the GPU figure does not exist. Exit 0.")
        return 0
    reg = dsv4_flash_mtp_off(tp_size=2)
    c = reg.bytes_per_chunk
    print(
        f"# {torch.cuda.get_device_name()} torch {torch.__version__}; {reg.model}: c={c} "
        f"B/chunk/rank, TP={reg.tp_size}, sizes {args.tokens}, W {args.windows}"
    )
    last: dict[str, float] = {}
    for tokens in args.tokens:
        last = measure_size(torch, reg, tokens, args)
        torch.cuda.empty_cache()
    w = max(args.windows)
    bsr = last.get(f"bsr W={w} B={2 * w}", 0.0)
    print(
        f"gpu: bsr W={w}/whole-plan={bsr / last['whole-plan (W=0)']:.2f} "
        f"h2d={last['h2d whole plan (no core)'] / GIB:.2f} GiB/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
