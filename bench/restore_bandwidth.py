"""Restore at the tier's limit: BSR against the best raw reader of each tier, in one run.

    PYTHONPATH=$PWD .venv/bin/python bench/restore_bandwidth.py \\
        [--tokens 8192 65536] [--windows 8] [--repeat 3] [--conc 4] [--conc-sweep 1 2 4 8] \\
        [--tiers fs mooncake] [--root DIR]

Paper geometry (DeepSeek-V4-Flash MTP-off registration, TP = 2, 16,408,576 B per chunk per
rank), restored through LMCache's real StorageManager (one per rank, null destination: no
H2D copy exists here, install = count bytes) from two tiers:

FS L2 (files under --root, O_DIRECT, page cache dropped before every pass):
  raw k=1,2,4,8   k threads reading the prefix's L2 files with O_DIRECT, one file at a time
                  each (the physical limit is the best of the four)
  whole-plan      W = 0: stock single-shot locked prefetch (L1 sized to fit), if RAM allows
  bsr B=W, B=2W   BSR windows (B = 2W: window j+1 fetched while j is installed), in their
                  own deployment with L1 = 2W*c + 64 MiB (what BSR is deployed with)
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

Last line: ``fs: bsr/best-raw=X.XX bsr/whole-plan=Y.YY mooncake: bsr/best-raw=Z.ZZ
peak_bytes=N`` at the largest size and the first W, B = 2W; N is that run's staging peak
per rank (B·c exactly when the restore pool is flat).
"""

from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bsrctl.lmcache_ext.adapters.fileio import preadv_full
from bsrctl.registration import Registration, dsv4_flash_mtp_off
from bsrctl.settings import RestoreSettings
from bsrctl.stack.storage import StorageStack, StorageStackConfig, deploy

GIB = 1 << 30
MIB = 1 << 20
L1_MARGIN = 64 * MIB
READERS = (1, 2, 4, 8)


# ---- helpers -----------------------------------------------------------------------------


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def whole_l1_bytes(reg: Registration, n: int) -> int:
    return int(n * reg.bytes_per_chunk / 0.75) + L1_MARGIN  # above LMCache's 0.8 watermark


def make(
    root: Path,
    reg: Registration,
    l1_bytes: int,
    conc: int,
    odirect: bool = True,
    mooncake_master: str = "",
) -> StorageStack:
    return deploy(
        StorageStackConfig(
            root_dir=root,
            registration=reg,
            l1_capacity_bytes=l1_bytes,
            restore=RestoreSettings(
                use_odirect=odirect, load_concurrency=conc, window_timeout_s=120.0
            ),
            l2_adapter="bsr_mooncake" if mooncake_master else "bsr_fs",
            mooncake_master=mooncake_master,
            destination="null",
        )
    )


def keys_of(stack: StorageStack) -> list[tuple[int, Any]]:
    """(rank, key) of every object of the seeded prefix, chunk-major."""
    assert stack.seeded is not None
    return [
        (rank, stack._key(h, rank, g.index))  # noqa: SLF001 - the keys the stack seeded
        for h in stack.seeded.hashes
        for rank in range(stack.registration.tp_size)
        for g in stack.registration.groups
    ]


class Rounds:
    """Modes measured round-robin: every round runs each mode once, in order."""

    def __init__(self) -> None:
        self.modes: list[tuple[str, Callable[[], dict[str, Any]]]] = []
        self.runs: dict[str, list[dict[str, Any]]] = {}

    def add(self, label: str, fn: Callable[[], dict[str, Any]]) -> None:
        self.modes.append((label, fn))
        self.runs[label] = []

    def run(self, repeat: int) -> None:
        """Round r starts at mode r*k/repeat (cyclic): the shared disk's speed drifts
        (measured: the same restore read 1.1 to 2.2 GiB/s from one pass to the next), so
        no mode always runs early or late in a round."""
        k = len(self.modes)
        for r in range(repeat):
            at = (r * k // repeat) % k  # spread the starts over the whole round
            for label, fn in self.modes[at:] + self.modes[:at]:
                self.runs[label].append(fn())

    def median(self, label: str) -> dict[str, Any]:
        """The run of median seconds (its other fields kept together)."""
        runs = sorted(self.runs[label], key=lambda r: r["s"])
        return runs[(len(runs) - 1) // 2]


# ---- raw readers -------------------------------------------------------------------------


_BUFFERS: dict[tuple[int, int], mmap.mmap] = {}


def reader_buffer(i: int, size: int) -> mmap.mmap:
    """Reader i's page-aligned buffer, made and touched once and reused by every pass (as
    L1's pool is by the restores): a pass times reads, not page faults of fresh memory."""
    buf = _BUFFERS.get((i, size))
    if buf is None:
        buf = _BUFFERS[(i, size)] = mmap.mmap(-1, size)
        buf.write(bytes(size))
    return buf


def run_threads(work: Callable[[Any], None], args: Iterable[Any]) -> float:
    """One thread per argument, started together; seconds until the last one is done."""
    threads = [threading.Thread(target=work, args=(a,)) for a in args]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def parallel_read(paths: list[Path], readers: int, odirect: bool) -> tuple[float, int]:
    """``readers`` threads read whole files (next file from a shared list) into their own
    page-aligned buffer. Returns (seconds, bytes)."""
    largest = max(p.stat().st_size for p in paths)
    bufs = [reader_buffer(i, largest) for i in range(readers)]
    nxt = iter(paths)
    lock = threading.Lock()
    total = [0] * readers
    errors: list[BaseException] = []
    flags = os.O_RDONLY | (os.O_DIRECT if odirect else 0)

    def work(i: int) -> None:
        whole = memoryview(bufs[i])
        try:
            while True:
                with lock:
                    p = next(nxt, None)
                if p is None:
                    return
                fd = os.open(p, flags)
                try:
                    total[i] += preadv_full(fd, whole, os.fstat(fd).st_size)
                finally:
                    os.close(fd)
        except BaseException as e:  # reported by the caller
            errors.append(e)
        finally:
            whole.release()

    dt = run_threads(work, range(readers))
    if errors:
        raise errors[0]
    return dt, sum(total)


# ---- one restore -------------------------------------------------------------------------


def restore_once(stack: StorageStack, w: int, b: int, rid: str) -> dict[str, Any]:
    stack.forget()
    stack.drop_page_cache()
    r = stack.restore(w, b, request_id=rid)
    if not r.ok or r.cached_tokens != r.expected_cached_tokens:
        raise SystemExit(f"restore W={w} B={b} failed: {r.failure or r.cached_tokens}")
    out = stack.last_outcome
    assert out is not None
    return {
        "s": r.restore_s,
        "bytes": r.bytes_restored,
        "peak": r.restore_pool_peak_bytes,
        "gauge_peak": max(r.gauge_peak_bytes_by_rank.values(), default=0),
        "first_s": out.first_install_s,
        "windows": [t.to_json() for t in out.timings],
    }


def phase_means(windows: list[dict[str, float]]) -> str:
    """Mean per window of fetch, wait, install, sync (ms), and the admission wait."""
    if not windows:
        return ""
    n = len(windows)

    def mean(k: str) -> float:
        return 1000 * sum(w[k] for w in windows) / n

    return (
        f"per window (n={n}) fetch {mean('fetch_s'):.1f} wait {mean('wait_s'):.1f} "
        f"install {mean('install_s'):.2f} sync {mean('sync_s'):.2f} "
        f"admit {mean('admit_wait_s'):.2f} ms"
    )


def adapter_of(stack: StorageStack, rank: int) -> Any:
    (_desc, adapter), *_ = stack.managers[rank].l2_adapters()
    return adapter


def lookup_rounds(stack: StorageStack, repeat: int) -> dict[str, float]:
    """Probe-only lookup of the whole prefix vs the stock lookup-and-lock of the same keys
    (what LMCache's own lookup issues to each L2 adapter before it loads), both ranks."""
    assert stack.seeded is not None
    request = stack.request("bench-lookup", stack.seeded.hashes)
    restorer = stack.make_restorer(stack.config.restore.with_window(8).core_config())
    by_rank: dict[int, list[Any]] = {}
    for row in request.rows:
        by_rank.setdefault(row.row.rank, []).extend(row.keys)
    probe, stock = [], []
    for _ in range(repeat):
        stack.forget()
        t0 = time.monotonic()
        plan = restorer.probe(request)
        probe.append(time.monotonic() - t0)
        assert plan.prefix_chunks == request.num_chunks, plan
        t0 = time.monotonic()
        found = {}
        for rank, keys in by_rank.items():
            adapter = adapter_of(stack, rank)
            task = adapter.submit_lookup_and_lock_task(keys, stack.layouts)
            res = adapter.query_lookup_and_lock_result(task)
            while res is None:
                time.sleep(0.0005)
                res = adapter.query_lookup_and_lock_result(task)
            found[rank] = res.get_indices_list()
        stock.append(time.monotonic() - t0)
        for rank, idx in found.items():  # stock would unlock after its load; not timed
            adapter_of(stack, rank).submit_unlock([by_rank[rank][i] for i in idx])
        assert all(len(v) == len(by_rank[r]) for r, v in found.items())
    return {"probe_s": statistics.median(probe), "stock_s": statistics.median(stock)}


# ---- FS tier -----------------------------------------------------------------------------


def fs_tier(args: argparse.Namespace, reg: Registration, tokens: int, out: list[str]) -> dict:
    c, n = reg.bytes_per_chunk, reg.num_chunks(tokens)
    wmax = max(args.windows)
    whole_l1 = whole_l1_bytes(reg, n)
    whole_ok = whole_l1 * reg.tp_size + 4 * GIB < mem_available()
    l1 = whole_l1 if whole_ok else 2 * wmax * c + L1_MARGIN
    res: dict[str, Any] = {"tokens": tokens, "rows": []}
    root_ctx = tempfile.TemporaryDirectory(dir=args.root, prefix="bsr-bench-fs-")
    root = Path(root_ctx.name)
    say(
        out,
        f"## FS L2, {tokens} tokens: N={n} chunks, {n * c * reg.tp_size / GIB:.2f} GiB of "
        f"files under {root}; adapter load_concurrency={args.conc} per rank",
    )
    try:
        stack = make(root, reg, l1, args.conc)
        stacks = [stack]
        try:
            seed = stack.seed(tokens, f"bench-{tokens}", drop_cache=True)
            say(out, f"# seeded {seed.bytes_written / GIB:.2f} GiB in {seed.seed_s:.1f}s")
            paths = [stack.path_of(k) for _r, k in keys_of(stack)]
            rounds = Rounds()

            def raw(k: int) -> Callable[[], dict[str, Any]]:
                def go() -> dict[str, Any]:
                    stack.drop_page_cache()
                    s, nbytes = parallel_read(paths, k, odirect=True)
                    return {"s": s, "bytes": nbytes}

                return go

            for k in READERS:
                rounds.add(f"raw O_DIRECT readers={k}", raw(k))
            if whole_ok:
                rounds.add("whole-plan (W=0)", lambda: restore_once(stack, 0, 0, "w0"))
            # BSR runs in its own deployment, as it would be deployed: L1 = 2W*c + margin
            bsr = make(root, reg, 2 * wmax * c + L1_MARGIN, args.conc)
            stacks.append(bsr)
            bsr.seed(tokens, f"bench-{tokens}")
            for w in args.windows:
                for b in (w, 2 * w):
                    rounds.add(
                        f"bsr W={w} B={b}",
                        lambda w=w, b=b: restore_once(bsr, w, b, f"w{w}b{b}"),
                    )
            conc_labels = []
            for k in args.conc_sweep if tokens == min(args.tokens) else ():
                s2 = make(root, reg, 2 * args.windows[0] * c + L1_MARGIN, k)
                stacks.append(s2)
                s2.seed(tokens, f"bench-{tokens}")
                w = args.windows[0]
                label = f"conc sweep: bsr W={w} B={2 * w} load_concurrency={k}"
                conc_labels.append(label)

                def conc_run(s2: StorageStack = s2, w: int = w, k: int = k) -> dict[str, Any]:
                    before = [adapter_of(s2, r).counters() for r in s2.managers]
                    got = restore_once(s2, w, 2 * w, f"conc{k}")
                    after = [adapter_of(s2, r).counters() for r in s2.managers]
                    got["read_ns"] = sum(
                        a["read_ns"] - b["read_ns"] for a, b in zip(after, before, strict=True)
                    )
                    got["read_bytes"] = sum(
                        a["read_bytes"] - b["read_bytes"]
                        for a, b in zip(after, before, strict=True)
                    )
                    got["peak_inflight"] = max(a["peak_inflight_loads"] for a in after)
                    return got

                rounds.add(label, conc_run)
            t0 = time.monotonic()
            rounds.run(args.repeat)
            say(
                out,
                f"# {args.repeat} rounds of {len(rounds.modes)} modes in "
                f"{time.monotonic() - t0:.0f}s",
            )
            look = lookup_rounds(stack, max(5, args.repeat))
        finally:
            for s in stacks:
                s.teardown()
    finally:
        root_ctx.cleanup()
    say(out, f"{'mode':52} {'s':>7} {'GiB/s':>6} {'first ms':>8} {'peak B/rank':>11}  runs GiB/s")
    for label, _fn in rounds.modes:
        m = rounds.median(label)
        rates = " ".join(f"{r['bytes'] / r['s'] / GIB:.2f}" for r in rounds.runs[label])
        first = f"{1000 * m['first_s']:8.1f}" if m.get("first_s") is not None else f"{'':8}"
        peak = f"{m['peak']:11d}" if "peak" in m else f"{'':11}"
        say(
            out,
            f"{label:52} {m['s']:7.3f} {m['bytes'] / m['s'] / GIB:6.2f} {first} {peak}  [{rates}]",
        )
        res["rows"].append({"label": label, **{k: v for k, v in m.items() if k != "windows"}})
        if m.get("windows"):
            say(out, f"{'':4}{phase_means(m['windows'])}")
        if "read_ns" in m and m["read_ns"]:
            svc = m["read_bytes"] / (m["read_ns"] / 1e9) / GIB
            say(
                out,
                f"{'':4}adapter reads: {svc:.2f} GiB/s per read in flight, "
                f"{m['read_ns'] / 1e9 / m['s']:.2f} reads in flight on average "
                f"(peak {m['peak_inflight']} per rank)",
            )
    rate = {r["label"]: r["bytes"] / r["s"] for r in res["rows"]}
    best_raw = max((v, k) for k, v in rate.items() if k.startswith("raw"))
    res.update(
        best_raw=best_raw[0],
        best_raw_label=best_raw[1],
        rate=rate,
        whole=rate.get("whole-plan (W=0)"),
        lookup=look,
    )
    if not whole_ok:
        say(
            out,
            f"# whole plan not run: {reg.tp_size} x {whole_l1 / GIB:.1f} GiB of L1 does "
            f"not fit in {mem_available() / GIB:.1f} GiB available",
        )
    say(out, f"# best raw: {best_raw[1]} {best_raw[0] / GIB:.2f} GiB/s")
    say(
        out,
        f"# lookup of the whole prefix ({n} chunks x {reg.tp_size} ranks x "
        f"{len(reg.groups)} groups): probe-only {1000 * look['probe_s']:.2f} ms, stock "
        f"lookup-and-lock {1000 * look['stock_s']:.2f} ms, ratio "
        f"{look['probe_s'] / look['stock_s']:.2f}",
    )
    return res


# ---- Mooncake tier -----------------------------------------------------------------------


def mooncake_tier(args: argparse.Namespace, reg: Registration, out: list[str]) -> list[dict]:
    """Start a Mooncake master + node in a private namespace; measure inside it."""
    from bsrctl.stack.mooncake import start_mooncake
    from bsrctl.stack.netns import start_netns

    c = reg.bytes_per_chunk
    need = max(reg.num_chunks(t) for t in args.tokens) * c * reg.tp_size
    segment = need + GIB
    log_dir = Path(tempfile.mkdtemp(prefix="bsr-bench-mc-", dir=args.root))
    ns = start_netns(log_dir, "bench-netns")
    results: list[dict] = []
    try:
        mc = start_mooncake(ns, log_dir, segment_size=str(segment), health_timeout_s=60.0)
        try:
            for tokens in args.tokens:
                argv = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--mooncake-worker",
                    mc.endpoints.master_address,
                    "--tokens",
                    str(tokens),
                    "--windows",
                    *map(str, args.windows),
                    "--repeat",
                    str(args.repeat),
                    "--mc-whole-max-gib",
                    str(args.mc_whole_max_gib),
                    "--mc-parallel",
                    *map(str, args.mc_parallel),
                    "--conc",
                    str(args.mc_load_workers),
                    "--mc-load-workers-sweep",
                    *map(str, args.mc_load_workers_sweep if tokens == min(args.tokens) else []),
                ]
                say(
                    out,
                    f"## Mooncake, {tokens} tokens: store segment {segment / GIB:.1f} GiB "
                    f"(TCP over the namespace's loopback), client in the namespace",
                )
                proc = subprocess.run(
                    ns.wrap(argv), capture_output=True, text=True, timeout=args.mc_timeout_s
                )
                res = None
                for line in proc.stdout.splitlines():
                    if line.startswith("{"):
                        res = json.loads(line)
                    else:
                        say(out, line)
                if proc.returncode != 0 or res is None:
                    tail = "\n".join(proc.stderr.splitlines()[-15:])
                    raise SystemExit(f"mooncake worker failed ({proc.returncode}):\n{tail}")
                results.append(res)
        finally:
            mc.stop(timeout_s=10.0)
    finally:
        ns.stop()
        import shutil

        shutil.rmtree(log_dir, ignore_errors=True)
    return results


def mooncake_worker(args: argparse.Namespace) -> int:
    """Inside the store's namespace: baselines through the client, then BSR, round-robin."""
    import numpy as np

    reg = dsv4_flash_mtp_off(tp_size=2)
    c, tokens = reg.bytes_per_chunk, args.tokens[0]
    n, w0 = reg.num_chunks(tokens), args.windows[0]
    out: list[str] = []
    whole_l1 = whole_l1_bytes(reg, n)
    # the store's segment holds the prefix in RAM too: a whole-plan L1 only for small sizes
    whole_ok = n * c * reg.tp_size <= args.mc_whole_max_gib * GIB
    l1 = whole_l1 if whole_ok else 2 * max(args.windows) * c + L1_MARGIN
    root = Path(tempfile.mkdtemp(prefix="bsr-bench-mcw-"))
    stack = make(root, reg, l1, args.conc, mooncake_master=args.mooncake_worker)
    others: list[StorageStack] = []
    try:
        seed = stack.seed(tokens, f"bench-mc-{tokens}")
        say(out, f"# seeded {seed.bytes_written / GIB:.2f} GiB into Mooncake in {seed.seed_s:.1f}s")
        objs = keys_of(stack)
        names = [stack.mooncake_name(k) for _r, k in objs]
        sizes = [reg.group_bytes_per_chunk(k.object_group_id) for _r, k in objs]
        client = stack.mooncake_store(0)
        per_window = len(reg.groups) * reg.tp_size * w0  # objects of one window, both ranks
        buf = np.zeros(sum(sorted(sizes)[-per_window:]) + 4096, dtype=np.uint8)
        base = buf.ctypes.data
        rounds = Rounds()

        def batch() -> dict[str, Any]:
            t0, got = time.monotonic(), 0
            for i in range(0, len(names), per_window):
                part, psz = names[i : i + per_window], sizes[i : i + per_window]
                ptrs, off = [], 0
                for s in psz:
                    ptrs.append(base + off)
                    off += s
                codes = client.batch_get_into(part, ptrs, psz)
                bad = [x for x, s in zip(codes, psz, strict=True) if x != s]
                if bad:
                    raise SystemExit(f"batch_get_into returned {bad[:3]}")
                got += sum(psz)
            return {"s": time.monotonic() - t0, "bytes": got}

        def par(k: int) -> Callable[[], dict[str, Any]]:
            bufs = [np.zeros(max(sizes), dtype=np.uint8) for _ in range(k)]

            def go() -> dict[str, Any]:
                nxt, lock, errs = iter(range(len(names))), threading.Lock(), []

                def work(j: int) -> None:
                    ptr = bufs[j].ctypes.data
                    while True:
                        with lock:
                            i = next(nxt, None)
                        if i is None:
                            return
                        rc = client.get_into(names[i], ptr, sizes[i])
                        if rc != sizes[i]:
                            errs.append(rc)

                s = run_threads(work, range(k))
                if errs:
                    raise SystemExit(f"get_into returned {errs[:3]}")
                return {"s": s, "bytes": sum(sizes)}

            return go

        clients = {r: stack.mooncake_store(r) for r in stack.managers}

        def per_rank_batches() -> dict[str, Any]:
            """Each rank's own client (as BSR has) fetches its objects, a window's worth per
            batch_get_into, both ranks at once, each into its own buffer."""
            mine = {r: [i for i, (rr, _k) in enumerate(objs) if rr == r] for r in clients}
            step = per_window // len(clients)
            rbufs = {r: np.zeros(sum(sorted(sizes)[-step:]) + 4096, np.uint8) for r in clients}
            errs: list[Any] = []

            def work(r: int) -> None:
                idx, rb = mine[r], rbufs[r].ctypes.data
                for i in range(0, len(idx), step):
                    part = idx[i : i + step]
                    ptrs, off = [], 0
                    for j in part:
                        ptrs.append(rb + off)
                        off += sizes[j]
                    psz = [sizes[j] for j in part]
                    codes = clients[r].batch_get_into([names[j] for j in part], ptrs, psz)
                    errs.extend(x for x, sz in zip(codes, psz, strict=True) if x != sz)

            s = run_threads(work, clients)
            if errs:
                raise SystemExit(f"batch_get_into returned {errs[:3]}")
            return {"s": s, "bytes": sum(sizes)}

        rounds.add(f"client batch_get_into ({per_window} objects/batch)", batch)
        rounds.add(f"client per rank ({len(clients)}) batch_get_into in parallel", per_rank_batches)
        for k in args.mc_parallel:
            rounds.add(f"client get_into parallel={k}", par(k))
        if whole_ok:
            rounds.add("whole-plan (W=0)", lambda: restore_once(stack, 0, 0, "mw0"))
        for w in args.windows:
            for b in (w, 2 * w):
                rounds.add(
                    f"bsr W={w} B={b}", lambda w=w, b=b: restore_once(stack, w, b, f"mw{w}b{b}")
                )
        # the adapter's load workers = batches in flight per rank (B = 2W keeps two windows)
        others = []
        for lw in args.mc_load_workers_sweep:
            s2 = make(
                root / f"lw{lw}",
                reg,
                2 * w0 * c + L1_MARGIN,
                lw,
                mooncake_master=args.mooncake_worker,
            )
            others.append(s2)
            s2.seeded = stack.seeded  # same objects, already in the store
            for b in (w0, 2 * w0):
                rounds.add(
                    f"lw sweep: bsr W={w0} B={b} load_workers={lw}",
                    lambda s2=s2, b=b: restore_once(s2, w0, b, "lw"),
                )
        t0 = time.monotonic()
        rounds.run(args.repeat)
        say(
            out,
            f"# {args.repeat} rounds of {len(rounds.modes)} modes in {time.monotonic() - t0:.0f}s",
        )
        look = lookup_rounds(stack, max(5, args.repeat))
        rows = []
        say(
            out,
            f"{'mode':52} {'s':>7} {'GiB/s':>6} {'first ms':>8} {'peak B/rank':>11}  runs GiB/s",
        )
        for label, _fn in rounds.modes:
            m = rounds.median(label)
            rates = " ".join(f"{r['bytes'] / r['s'] / GIB:.2f}" for r in rounds.runs[label])
            first = f"{1000 * m['first_s']:8.1f}" if m.get("first_s") is not None else f"{'':8}"
            peak = f"{m['peak']:11d}" if "peak" in m else f"{'':11}"
            say(
                out,
                f"{label:52} {m['s']:7.3f} {m['bytes'] / m['s'] / GIB:6.2f} {first} {peak}"
                f"  [{rates}]",
            )
            if m.get("windows"):
                say(out, f"{'':4}{phase_means(m['windows'])}")
            rows.append({"label": label, **{k: v for k, v in m.items() if k != "windows"}})
        rate = {r["label"]: r["bytes"] / r["s"] for r in rows}
        best = max((v, k) for k, v in rate.items() if k.startswith("client"))
        say(out, f"# best client baseline: {best[1]} {best[0] / GIB:.2f} GiB/s")
        say(
            out,
            f"# lookup of the whole prefix: probe-only {1000 * look['probe_s']:.2f} ms, "
            f"stock lookup {1000 * look['stock_s']:.2f} ms, ratio "
            f"{look['probe_s'] / look['stock_s']:.2f}",
        )
        client.batch_remove(names, True)  # free the segment for the next size
    finally:
        for s2 in others:
            s2.teardown()
        stack.teardown()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    for line in out:
        print(line, flush=True)
    print(
        json.dumps(
            {
                "tokens": tokens,
                "rows": rows,
                "rate": rate,
                "best_raw": best[0],
                "best_raw_label": best[1],
                "lookup": look,
            }
        ),
        flush=True,
    )
    return 0


# ---- main --------------------------------------------------------------------------------


def say(out: list[str], line: str) -> None:
    out.append(line)
    if not getattr(say, "quiet", False):
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
    ap.add_argument("--mooncake-worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    if args.mooncake_worker:
        say.quiet = True  # type: ignore[attr-defined]
        return mooncake_worker(args)
    reg = dsv4_flash_mtp_off(tp_size=2)
    c = reg.bytes_per_chunk
    out: list[str] = []
    say(
        out,
        f"# {reg.model}: c={c} B/chunk/rank, TP={reg.tp_size}, sizes {args.tokens} tokens, "
        f"W {args.windows}; null destination; reads O_DIRECT; {os.cpu_count()} CPUs",
    )
    t0 = time.monotonic()
    fs = [fs_tier(args, reg, t, out) for t in args.tokens] if "fs" in args.tiers else []
    mc = mooncake_tier(args, reg, out) if "mooncake" in args.tiers else []
    w = args.windows[0]
    label = f"bsr W={w} B={2 * w}"
    say(
        out,
        f"# total {time.monotonic() - t0:.0f}s; goal rows: {label} at {max(args.tokens)} tokens",
    )
    fields = []
    peak = None
    if fs:
        r = fs[-1]
        bsr = r["rate"][label]
        whole = next((x["whole"] for x in reversed(fs) if x["whole"]), None)
        whole_bsr = next((x["rate"][label] for x in reversed(fs) if x["whole"]), None)
        fields.append(f"fs: bsr/best-raw={bsr / r['best_raw']:.2f}")
        fields.append(f"bsr/whole-plan={whole_bsr / whole:.2f}" if whole else "bsr/whole-plan=n/a")
        peak = next(x["peak"] for x in r["rows"] if x["label"] == label)
    if mc:
        r = mc[-1]
        fields.append(f"mooncake: bsr/best-raw={r['rate'][label] / r['best_raw']:.2f}")
        peak = (
            peak if peak is not None else next(x["peak"] for x in r["rows"] if x["label"] == label)
        )
    say(out, f"# B*c = {2 * w * c} B per rank")
    print(" ".join(fields) + f" peak_bytes={peak}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
