"""Restore bandwidth on the storage stack, one run, side by side.

    .venv/bin/python bench/restore_bandwidth.py [--tokens 8192] [--window 8] [--root DIR]

Paper geometry (DeepSeek-V4-Flash MTP-off registration, TP = 2, 16,408,576 B per chunk per
rank) seeded into LMCache's filesystem L2 under --root, then restored through LMCache's
real StorageManager (one per rank) with:

  raw            sequential O_DIRECT read of the prefix's L2 files, one file at a time
  whole-plan     W = 0: stock single-shot locked prefetch of the whole plan (L1 sized to fit)
  bsr B=W        the paper: one window of W chunks live at a time
  bsr B=2W       pipelined: window j+1 is fetched while window j is installed
  fs conc 1 / 4  bsr B=2W over bsrctl's FS adapter with load_concurrency 1 and 4

Honesty notes, printed with the results:
- L2 reads use O_DIRECT (objects are 4 KiB multiples, L1 buffers 4 KiB-aligned) and the
  files are fsynced and dropped from the page cache (posix_fadvise DONTNEED) after
  seeding, so every figure is device reads, not page-cache memory copies. Buffered reads
  (--buffered) would mostly measure memcpy.
- The destination is the "null" sink (install = count bytes; no H2D copy exists here), so
  restore figures are fetch + staging + bookkeeping; one extra verifying run checks the
  bytes against the canonical contents.
- Each rank has its own StorageManager and FS adapter: stock loads are serial per adapter,
  so two ranks read two files at once.
- Figures are medians of --repeat runs on a shared virtual disk: expect noise.

Last line (for scripts): ``pipelined/raw=X.XX pipelined/whole-plan=Y.YY peak_bytes=N``.
"""

from __future__ import annotations

import argparse
import logging
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bsrctl.registration import dsv4_flash_mtp_off
from bsrctl.settings import RestoreSettings
from bsrctl.stack.storage import StorageStack, StorageStackConfig, deploy

GIB = 1 << 30


def have_bsr_fs() -> bool:
    try:
        import bsrctl.lmcache_ext.adapters.fs  # noqa: F401
    except ImportError:
        return False
    return True


def raw_read(stack: StorageStack, odirect: bool) -> tuple[float, int]:
    """Read every L2 file of the seeded prefix sequentially; returns (seconds, bytes)."""
    assert stack.seeded is not None
    paths = [
        stack.path_of(stack._key(h, rank, g.index))  # noqa: SLF001 - same key the stack seeded
        for h in stack.seeded.hashes
        for rank in range(stack.registration.tp_size)
        for g in stack.registration.groups
    ]
    largest = max(p.stat().st_size for p in paths)
    buf = mmap.mmap(-1, largest)  # page-aligned, as O_DIRECT needs
    whole = memoryview(buf)
    flags = os.O_RDONLY | (os.O_DIRECT if odirect else 0)
    total = 0
    t0 = time.monotonic()
    for p in paths:
        fd = os.open(p, flags)
        try:
            size = os.fstat(fd).st_size
            view = whole[:size]
            done = 0
            while done < size:
                n = os.readv(fd, [view[done:]])
                if n <= 0:
                    break
                done += n
            total += done
            del view
        finally:
            os.close(fd)
    dt = time.monotonic() - t0
    whole.release()
    buf.close()
    return dt, total


def timed_restore(stack: StorageStack, w: int, b: int, repeat: int) -> dict:
    runs = []
    for i in range(repeat):
        stack.forget()
        stack.drop_page_cache()
        r = stack.restore(w, b, request_id=f"bench-w{w}-b{b}-{i}")
        if not r.ok or r.cached_tokens != r.expected_cached_tokens:
            raise SystemExit(f"restore W={w} B={b} failed: {r.failure or r.cached_tokens}")
        runs.append(r)
    s = statistics.median(r.restore_s for r in runs)
    return {
        "s": s,
        "bytes": runs[0].bytes_restored,
        "peak": max(r.restore_pool_peak_bytes for r in runs),
    }


def make(
    root: Path, args: argparse.Namespace, l1_bytes: int, adapter: str, conc: int
) -> StorageStack:
    reg = dsv4_flash_mtp_off(tp_size=args.tp)
    return deploy(
        StorageStackConfig(
            root_dir=root,
            registration=reg,
            l1_capacity_bytes=l1_bytes,
            restore=RestoreSettings(
                use_odirect=not args.buffered, load_concurrency=conc, window_timeout_s=120.0
            ),
            l2_adapter=adapter,
            destination="null",
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192, help="prefix tokens (256-token chunks)")
    ap.add_argument("--window", type=int, default=8, help="W in chunks")
    ap.add_argument("--tp", type=int, default=2, help="TP ranks (one StorageManager each)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per mode (median)")
    ap.add_argument("--root", type=Path, default=None, help="L2 directory (a real disk, not tmpfs)")
    ap.add_argument("--buffered", action="store_true", help="buffered reads (measures memcpy)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)

    reg = dsv4_flash_mtp_off(tp_size=args.tp)
    c, w = reg.bytes_per_chunk, args.window
    n = reg.num_chunks(args.tokens)
    whole_l1 = int(n * c / 0.75) + (64 << 20)  # above LMCache's 0.8 eviction watermark
    root_ctx = tempfile.TemporaryDirectory(dir=args.root or "/var/tmp", prefix="bsr-bench-")
    root = Path(root_ctx.name)
    rows: list[tuple[str, float, int, int]] = []
    conc = 4 if have_bsr_fs() else 1
    adapter = "bsr_fs" if conc > 1 else "stock"
    print(
        f"# {reg.model}: c={c} B/chunk/rank, TP={args.tp}, N={n} chunks ({n * reg.chunk_tokens} "
        f"tokens), W={w}, {n * c * args.tp / GIB:.2f} GiB on disk under {root}",
        flush=True,
    )
    try:
        stack = make(root, args, whole_l1, adapter, conc)
        try:
            seed = stack.seed(n * reg.chunk_tokens, "bench", drop_cache=True)
            print(f"# seeded {seed.bytes_written / GIB:.2f} GiB in {seed.seed_s:.1f}s", flush=True)
            raws = []
            for _ in range(args.repeat):
                stack.drop_page_cache()
                raws.append(raw_read(stack, odirect=not args.buffered))
            dt, nbytes = sorted(raws)[len(raws) // 2]
            rows.append(("raw sequential read", dt, nbytes, 0))
            for label, ww, bb in (
                ("whole-plan (W=0)", 0, 0),
                (f"bsr B=W={w} (paper)", w, w),
                (f"bsr B=2W={2 * w} (pipelined)", w, 2 * w),
            ):
                r = timed_restore(stack, ww, bb, args.repeat)
                rows.append((label + f" [{adapter} conc {conc}]", r["s"], r["bytes"], r["peak"]))
            stack.forget()
            check = stack.restore(w, 2 * w, destination="verify", request_id="bench-verify")
            verify = f"verify_ok={check.verify_ok} ({check.bytes_restored} bytes compared)"
        finally:
            stack.teardown()
        fs_rows = []
        if have_bsr_fs():
            for k in (1, 4):
                s2 = make(root, args, 2 * w * c + (64 << 20), "bsr_fs", k)
                try:
                    s2.seed(n * reg.chunk_tokens, "bench")
                    r = timed_restore(s2, w, 2 * w, args.repeat)
                    fs_rows.append(
                        (f"bsr B=2W fs load_concurrency={k}", r["s"], r["bytes"], r["peak"])
                    )
                finally:
                    s2.teardown()
        else:
            fs_rows.append(
                ("fs load concurrency: bsrctl.lmcache_ext.adapters.fs missing", 0.0, 0, 0)
            )
    finally:
        root_ctx.cleanup()

    print(f"{'mode':58} {'seconds':>8} {'GiB/s':>7} {'peak bytes/rank':>16}")
    for label, s, nbytes, peak in rows + fs_rows:
        rate = nbytes / s / GIB if s else 0.0
        print(f"{label:58} {s:8.3f} {rate:7.2f} {peak:16d}")
    print(f"# W*c = {w * c} B/rank (B=W bound), 2W*c = {2 * w * c}; whole plan N*c = {n * c}")
    print(f"# {verify}; reads {'buffered (memcpy!)' if args.buffered else 'O_DIRECT'}; null sink")
    rate = {label: nbytes / s for label, s, nbytes, _ in rows if s}
    raw = rate["raw sequential read"]
    whole = next(v for k, v in rate.items() if k.startswith("whole-plan"))
    piped_label = next(k for k in rate if "(pipelined)" in k)
    peak = next(p for label, _, _, p in rows if label == piped_label)
    print(
        f"pipelined/raw={rate[piped_label] / raw:.2f} "
        f"pipelined/whole-plan={rate[piped_label] / whole:.2f} peak_bytes={peak}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
