"""The FS tier: raw O_DIRECT readers (the physical limit), the stock whole plan and BSR, and
BSR over the FS adapter's load concurrencies, all on the same L2 files."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from bsrctl.stack.storage import StorageStack

from . import fio
from .common import GIB, READERS, WHOLE, Rounds, Sample, Say, TierResult, table
from .raw import parallel_read
from .stacks import (
    adapter_of,
    bsr_l1_bytes,
    deploy,
    keys_of,
    lookup_rounds,
    registration,
    restore_once,
    target,
    whole_l1_bytes,
)
from .summary import checksum_ratio, no_checksum_label


def raw_mode(stack: StorageStack, paths: list[Path], k: int) -> Callable[[], Sample]:
    def go() -> Sample:
        stack.drop_page_cache()
        s, nbytes = parallel_read(paths, k, odirect=True)
        return Sample(s, nbytes)

    return go


def conc_mode(stack: StorageStack, w: int, k: int) -> Callable[[], Sample]:
    """BSR B = 2W, with the adapter's read counters over the restore."""

    def go() -> Sample:
        before = [adapter_of(stack, r).counters() for r in stack.managers]
        got = restore_once(stack, w, 2 * w, f"conc{k}")
        after = [adapter_of(stack, r).counters() for r in stack.managers]
        pairs = list(zip(after, before, strict=True))
        return replace(
            got,
            read_ns=sum(a["read_ns"] - b["read_ns"] for a, b in pairs),
            read_bytes=sum(a["read_bytes"] - b["read_bytes"] for a, b in pairs),
            peak_inflight=max(a["peak_inflight_loads"] for a in after),
        )

    return go


def bsr_modes(rounds: Rounds, stack: StorageStack, windows: list[int], prefix: str = "") -> None:
    """BSR at every W, B = W and B = 2W (window j+1 fetched while j is installed)."""
    for w in windows:
        for b in (w, 2 * w):
            rid = f"{prefix}w{w}b{b}"
            rounds.add(f"bsr W={w} B={b}", lambda w=w, b=b, rid=rid: restore_once(stack, w, b, rid))


def fio_modes(
    rounds: Rounds, stack: StorageStack, paths: list[Path], depths: list[int], say: Say
) -> None:
    """fio over the same files at every engine that works here and every depth."""
    binary = fio.fio_binary()
    if not depths:
        return
    if binary is None:
        say("# fio not found (Debian's fio; `make venv` installs it): no fio modes")
        return
    jobs = fio.FioJobs(binary, paths, paths[0].parent.parent / "fio")
    for engine, why in jobs.usable().items():
        if why is not None:
            say(f"# fio {engine}: not usable here ({why})")
            continue
        for d in depths:
            rounds.add(fio.label(engine, d), fio.fio_mode(stack, jobs, engine, d))
    sizes = {bs: len(f) for bs, f in jobs.classes.items()}
    say(f"# fio: objects by read size {sizes} (one object per read), depths {list(depths)}")


def fs_tier(args: argparse.Namespace, tokens: int, say: Say) -> TierResult:
    """Every FS mode at one size, round-robin over ``args.repeat`` rounds."""
    reg = registration()
    c, n = reg.bytes_per_chunk, reg.num_chunks(tokens)
    wmax = max(args.windows)
    whole_l1 = whole_l1_bytes(reg, n)
    root_ctx = tempfile.TemporaryDirectory(dir=args.root, prefix="bsr-bench-fs-")
    root = Path(root_ctx.name)
    whole_ok, fit = target(root).fits(whole_l1)
    say(
        f"## FS L2, {tokens} tokens: N={n} chunks, {n * c * reg.tp_size / GIB:.2f} GiB of "
        f"files under {root}; adapter load_concurrency={args.conc} per rank"
    )
    stacks: list[StorageStack] = []
    try:
        stack = deploy(root, whole_l1 if whole_ok else bsr_l1_bytes(reg, wmax), args.conc)
        stacks.append(stack)
        seed = stack.seed(tokens, f"bench-{tokens}", drop_cache=True)
        say(f"# seeded {seed.bytes_written / GIB:.2f} GiB in {seed.seed_s:.1f}s")
        paths = [stack.path_of(k) for _r, k in keys_of(stack)]
        rounds = Rounds()
        for k in READERS:
            rounds.add(f"raw O_DIRECT readers={k}", raw_mode(stack, paths, k))
        fio_modes(rounds, stack, paths, args.fio_depths, say)
        if whole_ok:
            rounds.add(WHOLE, lambda: restore_once(stack, 0, 0, "w0"))
        # BSR runs in its own deployment, as it would be deployed: L1 = 2W*c + margin
        bsr = deploy(root, bsr_l1_bytes(reg, wmax), args.conc)
        stacks.append(bsr)
        bsr.seed(tokens, f"bench-{tokens}")
        bsr_modes(rounds, bsr, args.windows)
        # the integrity cost: the goal row again, the same files, no checksum verified
        w = args.windows[0]
        bare = deploy(root, bsr_l1_bytes(reg, wmax), args.conc, checksum=False)
        stacks.append(bare)
        bare.seed(tokens, f"bench-{tokens}")
        label = no_checksum_label(w)
        rounds.add(label, lambda: restore_once(bare, w, 2 * w, f"nosum-w{w}"))
        for k in args.conc_sweep if tokens == min(args.tokens) else ():
            s2 = deploy(root, bsr_l1_bytes(reg, w), k)
            stacks.append(s2)
            s2.seed(tokens, f"bench-{tokens}")
            label = f"conc sweep: bsr W={w} B={2 * w} load_concurrency={k}"
            rounds.add(label, conc_mode(s2, w, k))
        t0 = time.monotonic()
        rounds.run(args.repeat, say)
        say(f"# {args.repeat} rounds of {len(rounds.modes)} modes in {time.monotonic() - t0:.0f}s")
        look = lookup_rounds(stack, max(5, args.repeat))
    finally:
        for s in stacks:
            s.teardown()
        root_ctx.cleanup()
    res = TierResult.of(tokens, table(say, rounds), "raw", look, rounds)
    if not whole_ok:
        say(
            f"# whole plan not run: {reg.tp_size} x {whole_l1 / GIB:.1f} GiB of L1 does not "
            f"fit ({fit})"
        )
    say(f"# best raw: {res.best_raw_label} {res.best_raw / GIB:.2f} GiB/s")
    say(f"# integrity: {checksum_ratio(res, args.windows[0])} ({bsr.tier_integrity} sidecars)")
    fios = [r for r in res.rows if r.label.startswith("fio")]
    if fios:
        best = max(fios, key=lambda r: r.rate)
        say(f"# best fio (this disk's limit): {best.label} {best.rate / GIB:.2f} GiB/s")
    say(
        f"# lookup of the whole prefix ({n} chunks x {reg.tp_size} ranks x "
        f"{len(reg.groups)} groups): probe-only {1000 * look.probe_s:.2f} ms, stock "
        f"lookup-and-lock {1000 * look.stock_s:.2f} ms, ratio {look.probe_s / look.stock_s:.2f}"
    )
    return res
