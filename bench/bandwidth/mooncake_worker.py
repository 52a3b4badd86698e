"""Inside the Mooncake store's namespace: the same objects through the store's own client
(the baselines), then BSR over LMCache with bsrctl's Mooncake adapter, round-robin; the
adapter's load workers (batches in flight per rank) compared at the first W."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bsrctl.stack.storage import StorageStack

from .common import GIB, WHOLE, Rounds, Sample, Say, TierResult, table
from .fs import bsr_modes
from .raw import run_threads
from .stacks import (
    bsr_l1_bytes,
    deploy,
    keys_of,
    lookup_rounds,
    registration,
    restore_once,
    whole_l1_bytes,
)


class Objects:
    """The seeded prefix's objects as the store names them, with each one's size."""

    def __init__(self, stack: StorageStack, w: int) -> None:
        reg = stack.registration
        self.objs = keys_of(stack)
        self.names = [stack.mooncake_name(k) for _r, k in self.objs]
        self.sizes = [reg.group_bytes_per_chunk(k.object_group_id) for _r, k in self.objs]
        self.per_window = len(reg.groups) * reg.tp_size * w  # one window's, both ranks

    def largest(self, n: int) -> int:
        """Bytes of the n largest objects (a buffer for any n of them), plus a page."""
        return sum(sorted(self.sizes)[-n:]) + 4096


def batched(client: Any, names: list[str], sizes: list[int], base: int, step: int) -> list[int]:
    """batch_get_into ``step`` objects at a time into one buffer at ``base``; the return
    codes that are not the object's size (errors)."""
    bad: list[int] = []
    for i in range(0, len(names), step):
        part, psz = names[i : i + step], sizes[i : i + step]
        ptrs, off = [], 0
        for s in psz:
            ptrs.append(base + off)
            off += s
        codes = client.batch_get_into(part, ptrs, psz)
        bad.extend(x for x, s in zip(codes, psz, strict=True) if x != s)
    return bad


def batch_mode(client: Any, ob: Objects) -> Callable[[], Sample]:
    """One client, one window's objects per batch_get_into."""
    buf = np.zeros(ob.largest(ob.per_window), dtype=np.uint8)

    def go() -> Sample:
        t0 = time.monotonic()
        bad = batched(client, ob.names, ob.sizes, buf.ctypes.data, ob.per_window)
        if bad:
            raise SystemExit(f"batch_get_into returned {bad[:3]}")
        return Sample(time.monotonic() - t0, sum(ob.sizes))

    return go


def per_rank_mode(clients: dict[int, Any], ob: Objects) -> Callable[[], Sample]:
    """Each rank's own client (as BSR has) fetches its objects, a window's worth per
    batch_get_into, both ranks at once, each into its own buffer."""
    mine = {r: [i for i, (rr, _k) in enumerate(ob.objs) if rr == r] for r in clients}
    step = ob.per_window // len(clients)
    bufs = {r: np.zeros(ob.largest(step), np.uint8) for r in clients}

    def go() -> Sample:
        errs: list[int] = []

        def work(r: int) -> None:
            names = [ob.names[j] for j in mine[r]]
            sizes = [ob.sizes[j] for j in mine[r]]
            errs.extend(batched(clients[r], names, sizes, bufs[r].ctypes.data, step))

        s = run_threads(work, clients)
        if errs:
            raise SystemExit(f"batch_get_into returned {errs[:3]}")
        return Sample(s, sum(ob.sizes))

    return go


def parallel_mode(client: Any, ob: Objects, k: int) -> Callable[[], Sample]:
    """k threads of get_into, one object at a time each."""
    bufs = [np.zeros(max(ob.sizes), dtype=np.uint8) for _ in range(k)]

    def go() -> Sample:
        nxt, lock, errs = iter(range(len(ob.names))), threading.Lock(), []

        def work(j: int) -> None:
            ptr = bufs[j].ctypes.data
            while True:
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                rc = client.get_into(ob.names[i], ptr, ob.sizes[i])
                if rc != ob.sizes[i]:
                    errs.append(rc)

        s = run_threads(work, range(k))
        if errs:
            raise SystemExit(f"get_into returned {errs[:3]}")
        return Sample(s, sum(ob.sizes))

    return go


def mooncake_worker(args: argparse.Namespace, say: Say) -> int:
    """Measure one size; print the table, then the TierResult as one JSON line."""
    reg = registration()
    c, tokens = reg.bytes_per_chunk, args.tokens[0]
    n, w0, master = reg.num_chunks(tokens), args.windows[0], args.mooncake_worker
    # the store's segment holds the prefix in RAM too: a whole-plan L1 only for small sizes
    whole_ok = n * c * reg.tp_size <= args.mc_whole_max_gib * GIB
    l1 = whole_l1_bytes(reg, n) if whole_ok else bsr_l1_bytes(reg, max(args.windows))
    root = Path(tempfile.mkdtemp(prefix="bsr-bench-mcw-"))
    stacks = [deploy(root, l1, args.conc, mooncake_master=master)]
    stack = stacks[0]
    try:
        seed = stack.seed(tokens, f"bench-mc-{tokens}")
        say(f"# seeded {seed.bytes_written / GIB:.2f} GiB into Mooncake in {seed.seed_s:.1f}s")
        ob = Objects(stack, w0)
        client = stack.mooncake_store(0)
        clients = {r: stack.mooncake_store(r) for r in stack.managers}
        rounds = Rounds()
        rounds.add(f"client batch_get_into ({ob.per_window} objects/batch)", batch_mode(client, ob))
        rounds.add(f"client per rank ({len(clients)}) batch_get_into in parallel",
                   per_rank_mode(clients, ob))  # fmt: skip
        for k in args.mc_parallel:
            rounds.add(f"client get_into parallel={k}", parallel_mode(client, ob, k))
        if whole_ok:
            rounds.add(WHOLE, lambda: restore_once(stack, 0, 0, "mw0"))
        bsr_modes(rounds, stack, args.windows, prefix="m")
        # the adapter's load workers = batches in flight per rank (B = 2W keeps two windows)
        for lw in args.mc_load_workers_sweep:
            s2 = deploy(root / f"lw{lw}", bsr_l1_bytes(reg, w0), lw, mooncake_master=master)
            stacks.append(s2)
            s2.seeded = stack.seeded  # same objects, already in the store
            for b in (w0, 2 * w0):
                rounds.add(f"lw sweep: bsr W={w0} B={b} load_workers={lw}",
                           lambda s2=s2, b=b: restore_once(s2, w0, b, "lw"))  # fmt: skip
        t0 = time.monotonic()
        rounds.run(args.repeat, say)
        say(f"# {args.repeat} rounds of {len(rounds.modes)} modes in {time.monotonic() - t0:.0f}s")
        look = lookup_rounds(stack, max(5, args.repeat))
        res = TierResult.of(tokens, table(say, rounds), "client", look, rounds)
        say(f"# best client baseline: {res.best_raw_label} {res.best_raw / GIB:.2f} GiB/s")
        say(
            f"# lookup of the whole prefix: probe-only {1000 * look.probe_s:.2f} ms, "
            f"stock lookup {1000 * look.stock_s:.2f} ms, ratio {look.probe_s / look.stock_s:.2f}"
        )
        client.batch_remove(ob.names, True)  # free the segment for the next size
    finally:
        for s in reversed(stacks):
            s.teardown()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(res.to_json()), flush=True)
    return 0
