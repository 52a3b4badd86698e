"""The GPU check: bench/restore_gpu.py at the BSR paper's geometry, within a time budget.

    python3 bench/gpu_check.py [--budget-s 450] [--dry-run] [--host-mem-gib G --gpu-mem-gib G]

Needs only Python 3.11+ and torch with CUDA (no vLLM, LMCache, pydantic; bsrctl comes from
this tree). The geometry is the paper's: DeepSeek-V4-Flash MTP off, 16,408,576 B per chunk
per rank in three object groups, TP 2, 256-token chunks, W = 32 (and W = 8 beside it), at
the prefix sizes of its E1 sweep (32,768 ... 524,032 tokens). Each size runs in its own
process, smallest first, so the memory of one size is back before the next and a size
that fails leaves the smaller ones' figures. A size is run only if its pinned host copy
(torch's host allocator rounds each object up to a power of two) and its GPU pool fit this
machine, and if its predicted time (from the sizes before it) fits what is left of the
budget; what is skipped is said with why. Without a CUDA device restore_gpu.py says so
and this exits 0. ``--dry-run`` prints the plan and the commands and runs nothing.

Last line: restore_gpu.py's own last line at the largest size run,
``gpu: bsr W=32/whole-plan=X.XX h2d=G.GG GiB/s``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bsrctl.registration.dsv4 import dsv4_flash_mtp_off  # noqa: E402  (standard library only)

PAPER_C = 16_408_576  # B per chunk per rank, the paper's MTP-off registration
PAPER_SIZES = (32768, 65536, 131072, 262144, 393216, 524032)  # its E1 sweep, tokens
WINDOWS = (8, 32)  # W = 32 is the paper's; W = 8 beside it
HOST_SHARE = 0.8  # of MemAvailable the pinned copy may take
GPU_SHARE = 0.9  # of the free GPU memory the paged pool may take
GIB = 1 << 30


@dataclass(frozen=True)
class Size:
    tokens: int
    chunks: int
    host_bytes: int  # pinned objects as torch's host allocator rounds them
    gpu_bytes: int  # the paged pools, one per (rank, group)
    h2d_bytes: int  # what one restore copies


def pow2ceil(n: int) -> int:
    return 1 << (n - 1).bit_length()


def sizes(tokens: tuple[int, ...]) -> list[Size]:
    reg = dsv4_flash_mtp_off(tp_size=2)
    groups = [reg.group_bytes_per_chunk(g.index) for g in reg.groups]
    out = []
    for t in tokens:
        n = math.ceil(t / reg.chunk_tokens)
        host = n * reg.tp_size * sum(pow2ceil(b) for b in groups)
        out.append(Size(t, n, host, n * reg.tp_size * sum(groups), n * reg.tp_size * sum(groups)))
    return out


def host_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) << 10
    return 0


def gpu_free() -> int:
    """Free memory of GPU 0 (nvidia-smi, else torch in a subprocess); 0 without a GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        res = subprocess.run(
            [smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
        if res.returncode == 0 and res.stdout.strip().isdigit():
            return int(res.stdout.strip()) << 20
    probe = "import torch; print(torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0)"
    try:
        res = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        )
        return int(res.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0


def command(size: Size, repeat: int) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "bench" / "restore_gpu.py"),
        "--tokens", str(size.tokens),
        "--windows", *map(str, WINDOWS),
        "--repeat", str(repeat),
    ]  # fmt: skip


def plan(all_sizes: list[Size], host: int, gpu: int) -> tuple[list[Size], list[str]]:
    """The sizes that fit this machine's memory, and a line for each one that does not."""
    run, skipped = [], []
    for s in all_sizes:
        if s.host_bytes > HOST_SHARE * host:
            why = f"pinned {s.host_bytes / GIB:.1f} GiB > {HOST_SHARE:.0%} of {host / GIB:.1f}"
            skipped.append(f"{s.tokens}: {why} GiB available host memory")
        elif s.gpu_bytes > GPU_SHARE * gpu:
            why = f"pool {s.gpu_bytes / GIB:.1f} GiB > {GPU_SHARE:.0%} of {gpu / GIB:.1f}"
            skipped.append(f"{s.tokens}: {why} GiB free GPU memory")
        else:
            run.append(s)
    return run, skipped


def run_one(size: Size, repeat: int, timeout_s: float) -> tuple[int, str, float]:
    """One size in its own process, its output passed through; (exit, last line, seconds).
    Killed at ``timeout_s`` even when it prints nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        command(size, repeat), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env,
    )  # fmt: skip
    watchdog = threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    last = ""
    assert proc.stdout is not None
    for line in proc.stdout:  # restore_gpu prints a table per size, then its last line
        print(line, end="", flush=True)
        last = line.strip() or last
    rc = proc.wait()
    watchdog.cancel()
    if time.monotonic() - t0 >= timeout_s:
        return 124, f"restore_gpu {size.tokens}: past its {timeout_s:.0f} s", timeout_s
    return rc, last, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=450.0, help="the whole check's budget")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per mode (median)")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(PAPER_SIZES))
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    ap.add_argument("--host-mem-gib", type=float, help="assume this much available host memory")
    ap.add_argument("--gpu-mem-gib", type=float, help="assume this much free GPU memory")
    args = ap.parse_args()
    t0 = time.monotonic()
    reg = dsv4_flash_mtp_off(tp_size=2)
    geometry = (
        f"c={reg.bytes_per_chunk} B/chunk/rank, {len(reg.groups)} groups, TP {reg.tp_size}, "
        f"{reg.chunk_tokens}-token chunks, W {' '.join(map(str, WINDOWS))}"
    )
    note = "" if reg.bytes_per_chunk == PAPER_C else f" (NOT the paper's c={PAPER_C})"
    print(f"gpu_check: {reg.model}: {geometry}{note}", flush=True)
    host = int(args.host_mem_gib * GIB) if args.host_mem_gib is not None else host_available()
    gpu = int(args.gpu_mem_gib * GIB) if args.gpu_mem_gib is not None else gpu_free()
    print(f"gpu_check: {host / GIB:.1f} GiB host memory available, {gpu / GIB:.1f} GiB GPU free")
    todo, skipped = plan(sizes(tuple(sorted(args.tokens))), host, gpu)
    for s in todo:
        print(
            f"gpu_check: plan {s.tokens} tokens: N={s.chunks}, {s.h2d_bytes / GIB:.2f} GiB per "
            f"restore, {s.host_bytes / GIB:.2f} GiB pinned: {' '.join(command(s, args.repeat))}"
        )
    for line in skipped:
        print(f"gpu_check: skip {line}")
    if args.dry_run:
        print(f"gpu_check: dry run, {len(todo)} size(s) planned within {args.budget_s:.0f} s")
        return 0
    if gpu == 0:  # restore_gpu.py says what it finds (no torch, no CUDA) and exits 0
        todo = sizes((min(args.tokens),))
    last, done, prev = "", [], None
    for s in todo:
        left = args.budget_s - (time.monotonic() - t0)
        guess = prev[1] * s.h2d_bytes / prev[0] if prev else 0.0  # scaled from the last size
        if guess > left:
            print(f"gpu_check: skip {s.tokens}: predicted {guess:.0f} s > {left:.0f} s left")
            continue
        rc, line, took = run_one(s, args.repeat, left)
        if rc != 0:
            print(f"gpu_check: {s.tokens} tokens: exit {rc} after {took:.0f} s: {line}")
            break
        last, prev = line, (s.h2d_bytes, took)
        done.append(f"{s.tokens} ({took:.0f} s): {line}")
    for line in done:
        print(f"gpu_check: {line}")
    print(f"gpu_check: {len(done)} size(s) in {time.monotonic() - t0:.0f} s")
    print(last or "gpu: no figure (see above)")
    return 0 if last else 1


if __name__ == "__main__":
    sys.exit(main())
