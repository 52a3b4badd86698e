"""Windows staged directly into L1 (``bsrkv.lmcache_ext.bsr.windows``) against LMCache's own
prefetch of the same windows, over a real StorageManager with two real FS L2 tiers.

Every figure is exact: hit bitmaps, bytes against bytes regenerated from the key, L1 usage
from the allocator, the fault adapter's task and key counts.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import lmcext_kv as kv
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _object_key_to_filename

from bsrkv.lmcache_ext.adapters.fs import BsrFSL2AdapterConfig
from bsrkv.lmcache_ext.bsr.storage import LMCacheRestoreStorage
from bsrkv.lmcache_ext.bsr.windows import Phase
from bsrkv.lmcache_ext.faults import adapter as _registers_bsr_fault  # noqa: F401
from bsrkv.lmcache_ext.faults.config import BsrFaultL2AdapterConfig
from bsrkv.lmcache_ext.faults.control import fault_stats, set_fault_rules
from bsrkv.restore.types import RestoreRequest, RowId, RowKeys, Window

CHUNK = 64 * 1024
L1 = 16 * 1024 * 1024
N = 8
_names = itertools.count()


def tier(base: Path, name: str, rules: list | None = None) -> BsrFaultL2AdapterConfig:
    """bsrctl's FS adapter behind the fault wrapper (its counters tell which tier served)."""
    return BsrFaultL2AdapterConfig.from_dict(
        {
            "type": "bsr_fault",
            "name": name,
            "inner": {"type": "bsr_fs", "base_path": str(base), "checksum": True},
            "rules": rules or [],
        }
    )


def request(keys: list, rid: str = "r") -> RestoreRequest:
    return RestoreRequest(rid, (RowKeys(RowId(0, 0), tuple(keys), CHUNK),), 256)


def storage(sm, staging: str) -> LMCacheRestoreStorage:
    return LMCacheRestoreStorage(sm, {0: kv.layout(CHUNK)}, drain_timeout_s=10.0, staging=staging)


def exact(objs, keys) -> list[bool]:
    return [
        torch.equal(o.tensor.view(torch.uint8).view(kv.ROWS, -1), kv.canonical(k, CHUNK))
        for o, k in zip(objs, keys, strict=True)
    ]


@pytest.fixture(scope="module")
def two_tiers(tmp_path_factory):
    """One StorageManager over tiers A and B (L1 empty between tests)."""
    root = tmp_path_factory.mktemp("direct")
    names = (f"dw-a-{next(_names)}", f"dw-b-{next(_names)}")
    shm = f"bsrctl_test_direct_{os.getpid()}"  # alive beside the other tests' managers
    sm = kv.build_sm([tier(root / "a", names[0]), tier(root / "b", names[1])], L1, shm)
    yield sm, root, names
    sm.close()


def stored(sm, root: Path, salt: str) -> list:
    """N fresh objects held by both tiers, none in L1."""
    keys = kv.make_keys(N, salt)
    kv.store(sm, keys, CHUNK)
    files = [_object_key_to_filename(k) for k in keys]
    deadline = time.monotonic() + 30.0
    while not all((root / t / f).exists() for t in ("a", "b") for f in files):
        assert time.monotonic() < deadline, "the tiers never held every object"
        time.sleep(0.005)
    kv.forget(sm, keys)
    return keys


def hide(path: Path) -> Path:
    hidden = path.with_name(path.name + ".hidden")
    path.rename(hidden)
    return hidden


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    resident=st.sets(st.integers(0, N - 1), max_size=3),
    only_b=st.sets(st.integers(0, N - 1), max_size=3),
    nowhere=st.sets(st.integers(0, N - 1), max_size=2),
)
def test_each_key_from_l1_else_the_first_tier_holding_it(two_tiers, resident, only_b, nowhere):
    """Whatever L1 and the tiers hold: the direct window hits every key L1 or a tier holds
    (LMCache's prefetch the same up to the first miss), every hit's bytes are canonical,
    tier A serves what it holds, tier B the rest, and L1 is back to what it held before
    (the resident objects stay resident, unlocked)."""
    sm, root, (a_name, b_name) = two_tiers
    keys = stored(sm, root, f"direct-{next(_names)}")
    only_b, nowhere = only_b - resident, nowhere - resident
    hidden = []
    res_keys = [keys[i] for i in sorted(resident)]
    try:
        for i in only_b | nowhere:
            hidden.append(hide(root / "a" / _object_key_to_filename(keys[i])))
        for i in nowhere - only_b:
            hidden.append(hide(root / "b" / _object_key_to_filename(keys[i])))
        if res_keys:  # resident in L1 (their files exist: the store of them is a no-op)
            objs = sm.reserve_write(res_keys, kv.layout(CHUNK))
            for k in res_keys:
                objs[k].tensor.view(torch.uint8).view(kv.ROWS, -1).copy_(kv.canonical(k, CHUNK))
            sm.finish_write(res_keys)
        base = sm.get_l1_usage()[0]
        assert base == len(res_keys) * CHUNK
        expect = [i not in (nowhere - only_b) for i in range(N)]
        loaded_b = len((only_b | nowhere) - (nowhere - only_b) - resident)
        got = {}
        for staging in ("direct", "prefetch"):
            s = storage(sm, staging)
            before = {n: fault_stats(n)["load_hit_keys"] for n in (a_name, b_name)}
            t = s.stage(request(keys), Window(0, 0, N))
            result = s.wait(t, 10.0)
            assert result is not None
            hits = list(result.hits[0])
            prefix = expect.index(False) if False in expect else N
            # direct loads every key some tier holds; LMCache's "prefix" prefetch stops at
            # the first miss (a window with a miss fails the restore closed either way)
            want = expect if staging == "direct" else [i < prefix for i in range(N)]
            assert hits == want, staging
            with s.read(t, prefix) as objs:
                assert exact(objs[RowId(0, 0)], keys[:prefix]) == [True] * prefix
            s.release(t)
            assert sm.get_l1_usage()[0] == base, staging  # staging gone, residents kept
            served = {n: fault_stats(n)["load_hit_keys"] - before[n] for n in (a_name, b_name)}
            got[staging] = served
        assert got["direct"] == {a_name: sum(expect) - len(res_keys) - loaded_b, b_name: loaded_b}
        if prefix == N:  # the same plan: the same tier serves each key
            assert got["prefetch"] == got["direct"]
    finally:
        for p in hidden:
            p.rename(p.with_name(p.name.removesuffix(".hidden")))
        deadline = time.monotonic() + 10.0  # the store controller may still be reading them
        while sm.get_l1_usage()[0] and time.monotonic() < deadline:
            sm.delete_l1_keys(res_keys, force=True)
            time.sleep(0.005)
        assert sm.get_l1_usage()[0] == 0


def test_waiting_on_one_window_advances_the_next(two_tiers):
    """Pipelined (B >= 2W): window 1 staged beside window 0 is loading, or loaded, once
    window 0's wait returns: its loads did not wait for its own wait."""
    sm, root, _names = two_tiers
    keys = stored(sm, root, "pipe")
    s = storage(sm, "direct")
    req = request(keys, "pipe")
    t0 = s.stage(req, Window(0, 0, 4))
    t1 = s.stage(req, Window(1, 4, 8))
    assert (t0.phase, t1.phase) == (Phase.LOOKUP, Phase.LOOKUP)
    assert s.wait(t0, 10.0) is not None
    assert t1.phase >= Phase.LOAD
    assert sm.get_l1_usage()[0] >= 8 * CHUNK  # both windows staged
    assert s.wait(t1, 10.0).complete
    s.release(t0)
    s.release(t1)
    assert sm.get_l1_usage()[0] == 0


def test_a_load_in_flight_is_drained_before_anything_is_freed(tmp_path):
    """A window whose load is held past its wait: release keeps its staging objects until
    the load lands (TimeoutError while it has not), then frees all of it."""
    name = f"dw-held-{next(_names)}"
    sm = kv.build_sm([tier(tmp_path / "l2", name)], L1)
    try:
        keys = kv.make_keys(4, "held")
        kv.store(sm, keys, CHUNK)
        kv.forget(sm, keys)
        s = storage(sm, "direct")

        set_fault_rules([{"action": "delay", "delay_s": 1.0, "limit": 1}], name)
        t = s.stage(request(keys, "held"), Window(0, 0, 4))
        assert s.wait(t, 0.05) is None
        assert sm.get_l1_usage()[0] == 4 * CHUNK
        with pytest.raises(TimeoutError, match="still loading"):
            s.release(t, drain_s=0.05)
        assert sm.get_l1_usage()[0] == 4 * CHUNK  # nothing freed under the load
        s.release(t, drain_s=10.0)
        assert sm.get_l1_usage()[0] == 0
        assert fault_stats(name)["delayed_tasks"] == 1
        s.release(t)  # idempotent
    finally:
        sm.close()


@pytest.mark.parametrize("staging", ["direct", "prefetch"])
def test_window_k_is_load_task_k_in_either_staging(tmp_path, staging):
    """Fault rules count tasks as LMCache's prefetch makes them: each window is one lookup
    and one load task of its keys, so ``tasks: [1]`` drops window 1 in either staging."""
    name = f"dw-ord-{staging}-{next(_names)}"
    sm = kv.build_sm([tier(tmp_path / "l2", name, [{"action": "drop", "tasks": [1]}])], L1)
    try:
        keys = kv.make_keys(6, "ord")
        kv.store(sm, keys, CHUNK)
        kv.forget(sm, keys)
        s = storage(sm, staging)
        req = request(keys, "ord")
        outcomes = []
        for j in range(3):
            t = s.stage(req, Window(j, 2 * j, 2 * j + 2))
            outcomes.append(s.wait(t, 10.0).hits[0])
            s.release(t)
        assert outcomes == [(True, True), (False, False), (True, True)]
        stats = fault_stats(name)
        assert (stats["lookup_keys"], stats["load_keys"], stats["dropped_keys"]) == (6, 6, 2)
        assert sm.get_l1_usage()[0] == 0
    finally:
        sm.close()


def test_unknown_staging_is_refused(tmp_path):
    with pytest.raises(
        ValueError, match=r"window_staging 'eager': one of \['direct', 'prefetch'\]"
    ):
        LMCacheRestoreStorage(None, {}, staging="eager")


def test_bsr_fs_config_round_trip():
    cfg = BsrFSL2AdapterConfig.from_dict({"type": "bsr_fs", "base_path": "/x", "checksum": True})
    assert (cfg.checksum, cfg.checksum_algorithm.algorithm) == (True, "xxh3_128")
