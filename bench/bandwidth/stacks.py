"""The bench's storage stacks, deployed the one way every storage stack is
(``StorageTarget.deploy``), and what is measured on them: one restore, the lookup."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bsrctl.specs import StorageSpec, TargetSpec
from bsrctl.stack.storage import StorageStack
from bsrctl.stack.storage.target import StorageTarget
from bsrkv.registration import Registration
from bsrkv.settings import RestoreSettings

from .common import GIB, L1_MARGIN, Lookup, Sample

TP = 2
RESERVE = 4 * GIB  # RAM the whole-plan L1 must leave free


def bench_spec(root: Path | None = None) -> TargetSpec:
    """Paper geometry (DeepSeek-V4-Flash MTP off, TP = 2), L2 under ``root``, no H2D copy
    (null destination: install = count bytes)."""
    storage = StorageSpec(tp_ranks=TP, root_dir=root, destination="null")
    return TargetSpec(registration="dsv4-flash", storage=storage, memory_reserve_bytes=RESERVE)


def registration() -> Registration:
    return bench_spec().registration_for("storage")


def target(root: Path, mooncake_master: str = "") -> StorageTarget:
    """bsrctl's FS adapter at every load concurrency (it counts its reads), or Mooncake."""
    return StorageTarget(
        bench_spec(root), root, l2_adapter="bsr_fs", mooncake_master=mooncake_master
    )


def deploy(
    root: Path, l1_bytes: int, conc: int, mooncake_master: str = "", checksum: bool = True
) -> StorageStack:
    """A stack over ``root`` (or the Mooncake store at ``mooncake_master``): L1 of
    ``l1_bytes`` per rank, ``conc`` loads in flight per rank, O_DIRECT reads; the FS tier
    verifies each object's checksum sidecar at load unless ``checksum`` is off (the
    settings' default algorithm; the Mooncake tier verifies none either way)."""
    settings = RestoreSettings(
        use_odirect=True, load_concurrency=conc, window_timeout_s=120.0, checksum=checksum
    )
    return target(root, mooncake_master).deploy(l1_bytes, settings)


def whole_l1_bytes(reg: Registration, n: int) -> int:
    return int(n * reg.bytes_per_chunk / 0.75) + L1_MARGIN  # above LMCache's 0.8 watermark


def bsr_l1_bytes(reg: Registration, w: int) -> int:
    """What BSR is deployed with: room for B = 2W windows."""
    return 2 * w * reg.bytes_per_chunk + L1_MARGIN


def keys_of(stack: StorageStack) -> list[tuple[int, Any]]:
    """(rank, key) of every object of the seeded prefix, chunk-major."""
    assert stack.seeded is not None
    return [
        (rank, stack.key_of(h, rank, g.index))
        for h in stack.seeded.hashes
        for rank in range(stack.registration.tp_size)
        for g in stack.registration.groups
    ]


def adapter_of(stack: StorageStack, rank: int) -> Any:
    (_desc, adapter), *_ = stack.managers[rank].l2_adapters()
    return adapter


def restore_once(stack: StorageStack, w: int, b: int, rid: str) -> Sample:
    """Forget the prefix, drop the page cache, restore it with W = w, B = b."""
    stack.forget()
    stack.drop_page_cache()
    r = stack.restore(w, b, request_id=rid)
    if not r.ok or r.cached_tokens != r.expected_cached_tokens:
        raise SystemExit(f"restore W={w} B={b} failed: {r.failure or r.cached_tokens}")
    out = stack.last_outcome
    assert out is not None
    return Sample(
        s=r.restore_s,
        bytes=r.bytes_restored,
        peak=r.restore_pool_peak_bytes,
        gauge_peak=max(r.gauge_peak_bytes_by_rank.values(), default=0),
        first_s=out.first_install_s,
        windows=tuple(t.to_json() for t in out.timings),
    )


def lookup_rounds(stack: StorageStack, repeat: int) -> Lookup:
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
    return Lookup(statistics.median(probe), statistics.median(stock))
