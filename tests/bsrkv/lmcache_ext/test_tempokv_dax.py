"""TempoKV's device on the flash tier (``tempokv.flash``) over LMCache's real StorageManager
whose whole L1 is a Device-DAX arena on a real file (``devdax_path``, as
``--l1-devdax-path`` makes it): a committed claim is read-locked in L1 and its objects'
arena ranges mlocked (the kernel's VmLck grows by exactly its bytes), stage-ready once
mlock returned; release munlocks exactly them; a claim past the budget stays uncommitted
and takes the ordinary path (its pages are faulted in on demand); the stock read of an
unclaimed request ends at its retrieve, not at its lookup."""

from __future__ import annotations

import time
from pathlib import Path

import lmcext_kv as kv
import pytest
import torch
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.config import (
    EvictionConfig,
    L1ManagerConfig,
    L1MemoryManagerConfig,
    StorageManagerConfig,
)
from lmcache.v1.distributed.l2_adapters.config import L2AdaptersConfig
from lmcache.v1.distributed.storage_manager import StorageManager

from bsrkv.clock import VirtualClock
from bsrkv.lmcache_ext.bsr.storage import LMCacheRestoreStorage
from bsrkv.lmcache_ext.tempokv.config import LiveConfig
from bsrkv.lmcache_ext.tempokv.device import LiveObject
from bsrkv.lmcache_ext.tempokv.flash import DaxStagingDevice
from bsrkv.lmcache_ext.tempokv.live import LiveTempo
from bsrkv.restore.types import RowId
from bsrkv.tempokv.claims import ClaimState
from bsrkv.tempokv.controller import RetrievalGrant

CHUNK = 64 * 1024  # 16 pages
ARENA = 2 * 1024 * 1024
ROW = RowId(rank=0, group=0)


def vm_locked_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmLck:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmLck")


@pytest.fixture
def sm(tmp_path: Path):
    arena = tmp_path / "arena"
    with open(arena, "wb") as f:
        f.truncate(ARENA)  # pre-sized: LMCache maps ARENA bytes of it
    mem = L1MemoryManagerConfig(size_in_bytes=ARENA, use_lazy=False, shm_name="",
                                devdax_path=str(arena))  # fmt: skip
    manager = StorageManager(
        StorageManagerConfig(
            l1_manager_config=L1ManagerConfig(mem),
            eviction_config=EvictionConfig("LRU"),
            l2_adapter_config=L2AdaptersConfig([]),
        )
    )
    yield manager
    manager.close()


def in_arena(sm: StorageManager, n: int, tag: str) -> list[ObjectKey]:
    keys = kv.make_keys(n, tag)
    objs = sm.reserve_write(keys, kv.layout(CHUNK))
    for key in keys:
        objs[key].tensor.view(torch.uint8).view(kv.ROWS, -1).copy_(kv.canonical(key, CHUNK))
    sm.finish_write(keys)
    return keys


def objects(keys: list[ObjectKey]) -> list[LiveObject]:
    return [LiveObject(k.chunk_hash.hex(), ((ROW, k, CHUNK),)) for k in keys]


def stepped(sm: StorageManager, policy: str, budget_chunks: int) -> LiveTempo:
    storage = LMCacheRestoreStorage(sm, {0: kv.layout(CHUNK)})
    cfg = LiveConfig(policy=policy, capacity_bytes=ARENA, budget_bytes=budget_chunks * CHUNK,
                     prior_bytes_s=64 * CHUNK, tick_s=0.02, tier="dax")  # fmt: skip
    return LiveTempo(storage, cfg, clock=VirtualClock(0.0), loop=False)


def step_until(t: LiveTempo, cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        t.step()
        if cond():
            return
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def state(t: LiveTempo, cid: str) -> ClaimState:
    with t.lock:
        return t.controller.claims[cid].state


def test_commit_mlocks_exactly_the_claim_and_release_munlocks_it(sm) -> None:
    a, b = in_arena(sm, 4, "a"), in_arena(sm, 3, "b")
    base = vm_locked_bytes()
    t = stepped(sm, "immediate", budget_chunks=5)
    assert isinstance(t.device, DaxStagingDevice)
    try:
        t.report("A", objects(a))
        step_until(t, lambda: state(t, "A") is ClaimState.STAGEREADY)
        with t.lock:
            assert t.device.locked_bytes() == 4 * CHUNK
        assert vm_locked_bytes() - base == 4 * CHUNK  # the kernel agrees
        t.report("B", objects(b))  # 4 + 3 > 5: refused for the budget, stays planned
        for _ in range(5):
            t.step()
        assert state(t, "B") is ClaimState.PLANNED
        assert t.begin_retrieval("B") is RetrievalGrant.ORDINARY  # faults on demand
        assert vm_locked_bytes() - base == 4 * CHUNK
        assert t.begin_retrieval("A") is RetrievalGrant.READY
        t.end_retrieval("A")
        with t.lock:
            assert t.device.locked_bytes() == 0
        assert vm_locked_bytes() == base
        report = t.report_json()
    finally:
        t.close()
    assert vm_locked_bytes() == base
    assert report["peak_locked_bytes"] == 4 * CHUNK <= 5 * CHUNK
    assert [s["bytes"] for s in report["stages"]] == [4 * CHUNK]
    assert [s["missed"] for s in report["stages"]] == [0]
    got = kv.prefetch(sm, a, CHUNK)  # still in L1 (the arena), their read locks dropped
    assert got.l1_hits == list(range(4)) and got.exact == list(range(4))


def test_a_stock_read_ends_at_its_retrieve_on_the_flash_tier(sm) -> None:
    keys = in_arena(sm, 2, "s")
    t = stepped(sm, "tempokv", budget_chunks=4)
    try:
        sr = t.observe_stock("R", objects(keys))
        assert sr is not None and sr.size_bytes == 2 * CHUNK
        t.clock.advance(0.1)
        t.stock_done("R", 2)  # the lookup found its L1 hits: nothing was read yet
        assert sr.done_s is None and sr.chunks_found == 2
        t.clock.advance(0.2)
        t.end_retrieval("R", 0)  # the retrieve faulted them in: the read is done now
        assert sr.done_s == pytest.approx(0.3) and sr.outcome == "done"
        assert t.stock_json()["outcomes"] == {"done": 1}
    finally:
        t.close()


def test_the_loop_is_woken_when_staging_is_issued_and_when_its_mlocks_return(
    sm, monkeypatch
) -> None:
    """The loop's pass is event-driven where a poll can find something new: with a pass
    period far beyond the wait below, a committed claim still becomes stage-ready (its
    prefetch polled right after it was issued, its op completed right after the mlocks
    returned), so a held lookup is released then, not a pass later."""
    import bsrkv.lmcache_ext.tempokv.live as live

    monkeypatch.setattr(live, "LOOP_S", 3600.0)
    keys = in_arena(sm, 3, "w")
    storage = LMCacheRestoreStorage(sm, {0: kv.layout(CHUNK)})
    cfg = LiveConfig(policy="immediate", capacity_bytes=ARENA, budget_bytes=4 * CHUNK,
                     prior_bytes_s=64 * CHUNK, tick_s=0.0, tier="dax")  # fmt: skip
    t = LiveTempo(storage, cfg)  # the wall clock and its loop thread
    try:
        time.sleep(0.05)  # the loop's first pass is done: it now waits an hour for the next
        t.report("W", objects(keys))
        ready = t.begin_retrieval("W")
        assert ready in (RetrievalGrant.WAIT, RetrievalGrant.READY)
        assert t.wait_ready("W", timeout_s=20.0)
        assert state(t, "W") is ClaimState.STAGEREADY
        with t.lock:
            assert t.device.locked_bytes() == 3 * CHUNK
    finally:
        t.close()


def test_a_staging_the_pool_refused_is_started_by_the_next_pass(sm) -> None:
    """A commit whose staging thread could not take the op (the pool refused it) stands:
    the claim is committed, nothing raises into the handler, and the loop's next pass
    starts the op, which then becomes stage-ready as any other."""
    keys = in_arena(sm, 2, "r")
    t = stepped(sm, "immediate", budget_chunks=4)
    device = t.device
    assert isinstance(device, DaxStagingDevice)
    submit, refused = device._pool.submit, []

    def refuse_once(*args, **kw):
        if not refused:
            refused.append(args[0])
            raise RuntimeError("cannot schedule new futures after shutdown")
        return submit(*args, **kw)

    device._pool.submit = refuse_once  # type: ignore[method-assign]
    try:
        t.report("R", objects(keys))  # commits; its staging is refused, not raised
        assert len(refused) == 1 and state(t, "R") is ClaimState.STAGING
        with t.lock:
            assert list(device._ops) != [] and device._locking == {}
        step_until(t, lambda: state(t, "R") is ClaimState.STAGEREADY)
        with t.lock:
            assert device.locked_bytes() == 2 * CHUNK and device._locking == {}
    finally:
        t.close()


def test_close_cancels_the_stagings_not_started_and_releases_everything(sm) -> None:
    """Ops queued behind one the staging thread is on never start at close: the one running
    finishes, the rest are cancelled, and every read lock and mlock is released."""
    import threading

    keys = [in_arena(sm, 1, f"q{i}") for i in range(3)]
    base = vm_locked_bytes()
    storage = LMCacheRestoreStorage(sm, {0: kv.layout(CHUNK)})
    cfg = LiveConfig(policy="immediate", capacity_bytes=ARENA, budget_bytes=4 * CHUNK,
                     concurrency=3, prior_bytes_s=64 * CHUNK, tick_s=0.02, tier="dax")  # fmt: skip
    t = LiveTempo(storage, cfg, clock=VirtualClock(0.0), loop=False)  # three ops issued at once
    device = t.device
    assert isinstance(device, DaxStagingDevice)
    gate, load, started = threading.Event(), device._load, []

    def gated(op):  # the first op holds the staging thread until the test lets it go
        started.append(op)
        assert gate.wait(20.0)
        return load(op)

    device._load = gated  # type: ignore[method-assign]
    for i, k in enumerate(keys):
        t.report(f"Q{i}", objects(k))
    with t.lock:
        assert len(device._locking) == 3
    threading.Timer(0.2, gate.set).start()
    t.close()  # cancels the two queued ops, waits for the running one
    assert len(started) == 1 and device._locking == {} and device._ops == {}
    assert device.locked_bytes() == 0 and vm_locked_bytes() == base
    got = kv.prefetch(sm, [k for ks in keys for k in ks], CHUNK)
    assert got.l1_hits == [0, 1, 2]  # still in L1, no read lock left
