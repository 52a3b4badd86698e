"""bsrctl's fault adapter around a real FS adapter, in LMCache's real StorageManager."""

from __future__ import annotations

import json
from pathlib import Path

import lmcext_kv as kv
import pytest
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _object_key_to_filename

from bsrkv.lmcache_ext.faults.adapter import BsrFaultL2Adapter, BsrFaultL2AdapterConfig
from bsrkv.lmcache_ext.faults.control import (
    fault_stats,
    handle_control,
    set_fault_rules,
    write_control_file,
)

CHUNK = 256 * 1024
L1 = 32 * 1024 * 1024


def fault_config(base: Path, name: str, inner: dict | None = None, **extra):
    inner = inner or {"type": "bsr_fs", "base_path": str(base)}
    return BsrFaultL2AdapterConfig.from_dict(
        {"type": "bsr_fault", "name": name, "inner": inner, **extra}
    )


@pytest.fixture
def sm_factory():
    made = []

    def make(config):
        sm = kv.build_sm([config], L1)
        made.append(sm)
        return sm

    yield make
    for sm in made:
        sm.close()


def fetch(sm, keys, **kw):
    got = kv.prefetch(sm, keys, CHUNK, **kw)
    assert sm.get_l1_usage()[0] == 0
    return got


def test_drop_by_rank_position_and_hash(tmp_path, sm_factory):
    sm = sm_factory(fault_config(tmp_path, "rank"))
    rank0 = kv.make_keys(6, "r", rank=0, world=2)
    rank1 = kv.make_keys(6, "r", rank=1, world=2)
    kv.store(sm, rank0 + rank1, CHUNK)
    kv.forget(sm, rank0 + rank1)

    set_fault_rules([{"action": "drop", "ranks": [1]}], name="rank")
    assert fetch(sm, rank0).exact == list(range(6))
    one = fetch(sm, rank1)
    assert (one.hits, one.completed) == ([], True)
    assert fault_stats("rank")["dropped_keys"] == 6

    set_fault_rules([{"action": "drop", "positions": [2]}], name="rank")
    assert fetch(sm, rank0).exact == [0, 1, 3, 4, 5]
    assert fetch(sm, rank0, policy="prefix").hits == [0, 1]

    # selectors are AND-ed: this chunk on rank 0 only (rank 1 has the same chunk hashes)
    rule = {"action": "drop", "chunk_hashes": [rank0[4].chunk_hash.hex()], "ranks": [0]}
    set_fault_rules([rule], name="rank")
    assert rank0[4].chunk_hash == rank1[4].chunk_hash
    assert fetch(sm, rank0).exact == [0, 1, 2, 3, 5]
    assert fetch(sm, rank1).exact == list(range(6))

    set_fault_rules([], name="rank")
    assert fetch(sm, rank0).exact == list(range(6))
    events = fault_stats("rank")["events"]
    assert [e["fault"] for e in events] == ["drop"] * (6 + 2 + 1)


def test_drop_window_k_by_task_ordinal(tmp_path, sm_factory):
    """BSR issues one prefetch (one load task) per window: tasks=[1] fails window 1 only."""
    sm = sm_factory(fault_config(tmp_path, "win", rules=[{"action": "drop", "tasks": [1]}]))
    keys = kv.make_keys(12, "w")
    kv.store(sm, keys, CHUNK)
    kv.forget(sm, keys)
    set_fault_rules([{"action": "drop", "tasks": [1]}], name="win")  # re-arm: ordinals at 0
    windows = [keys[0:4], keys[4:8], keys[8:12]]
    assert [fetch(sm, w).exact for w in windows] == [[0, 1, 2, 3], [], [0, 1, 2, 3]]
    assert [e["task"] for e in fault_stats("win")["events"]] == [1, 1, 1, 1]


def test_lookup_phase_drop_looks_like_absence(tmp_path, sm_factory):
    sm = sm_factory(fault_config(tmp_path, "look"))
    keys = kv.make_keys(4, "l")
    kv.store(sm, keys, CHUNK)
    kv.forget(sm, keys)
    set_fault_rules([{"action": "drop", "phase": "lookup", "positions": [0]}], name="look")
    got = fetch(sm, keys)
    assert got.hits == [1, 2, 3]
    adapter = kv.adapters(sm)[0]
    assert kv.adapter_lookup(adapter, keys) == [1, 2, 3]


def test_delay_beyond_the_window_timeout(tmp_path, sm_factory):
    sm = sm_factory(fault_config(tmp_path, "slow"))
    keys = kv.make_keys(4, "d")
    kv.store(sm, keys, CHUNK)
    kv.forget(sm, keys)
    set_fault_rules([{"action": "delay", "delay_s": 2.0, "tasks": [0]}], name="slow")

    from lmcache.v1.distributed.api import GroupedObjectKeys, PrefetchTaskSpec

    spec = PrefetchTaskSpec(
        key_groups=[GroupedObjectKeys(keys=keys, object_group_id=0, layout_desc=kv.layout(CHUNK))]
    )
    handle = sm.submit_prefetch_task(spec)
    assert sm.wait_prefetch_status(handle, 0.5) is False  # the window timeout fires
    assert sm.wait_prefetch_status(handle, 10.0) is True  # the late result still arrives
    result = sm.query_prefetch_status(handle)
    hits = [keys[i] for i in result.hit_cells[0].get_indices_list()]
    sm.finish_read_prefetched(hits)  # release what the late load pinned
    assert sm.get_l1_usage()[0] == 0
    assert fetch(sm, keys).exact == [0, 1, 2, 3]  # task 1: not delayed
    assert fault_stats("slow")["delayed_tasks"] == 1


def test_control_file_rearms_at_run_time(tmp_path, sm_factory):
    control = tmp_path / "faults.json"
    sm = sm_factory(fault_config(tmp_path / "l2", "file", control_path=str(control)))
    keys = kv.make_keys(4, "f")
    kv.store(sm, keys, CHUNK)
    kv.forget(sm, keys)
    assert fetch(sm, keys).exact == [0, 1, 2, 3]  # no file: no rules
    write_control_file(control, [{"action": "drop", "key_ordinals": [1, 3]}])
    assert fetch(sm, keys).exact == [0, 2]
    assert fetch(sm, keys).exact == [0, 1, 2, 3]  # ordinals 5 and 7 are not 1 or 3
    write_control_file(control, [{"action": "drop", "limit": 1}])
    assert fetch(sm, keys).exact == [1, 2, 3]
    assert fetch(sm, keys).exact == [0, 1, 2, 3]  # the limit is spent
    control.write_text("{not json")
    assert fetch(sm, keys).exact == [0, 1, 2, 3]  # rejected file: rules kept (spent)
    control.unlink()
    assert fault_stats("file")["rules"] == 1
    assert fetch(sm, keys).exact == [0, 1, 2, 3]
    assert fault_stats("file")["rules"] == 0
    with pytest.raises(ValueError, match=r"rules\[0\].action"):
        write_control_file(control, [{"action": "explode"}])


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_verify_catches_corruption_the_stock_adapter_serves(tmp_path, sm_factory, algorithm):
    """Stock FS has no checksum: a flipped byte is a hit. verify=true makes it a miss."""
    base = tmp_path / "l2"
    sm = sm_factory(
        fault_config(
            base,
            f"verify-{algorithm}",
            inner={"type": "fs", "base_path": str(base)},
            verify=True,
            checksum_algorithm=algorithm,
            checksum_dir=str(tmp_path / "sums"),
        )
    )
    keys = kv.make_keys(6, "v")
    kv.store(sm, keys, CHUNK)
    kv.forget(sm, keys)
    path = base / _object_key_to_filename(keys[2])
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(raw)

    got = fetch(sm, keys)
    assert got.hits == [0, 1, 3, 4, 5]
    assert got.exact == got.hits
    stats = fault_stats(f"verify-{algorithm}")
    assert (stats["verify_mismatch"], stats["verify_missing"]) == (1, 0)
    assert stats["events"] == [{"fault": "verify_mismatch", "chunk_hash": keys[2].chunk_hash.hex()}]
    sums = sorted(p.suffix for p in (tmp_path / "sums").iterdir())
    assert sums == ["." + algorithm] * 6  # digests persisted, named for their algorithm


def test_handle_control_bytes_api(tmp_path, sm_factory):
    sm_factory(fault_config(tmp_path, "ctl"))
    set_reply = json.loads(
        handle_control(json.dumps({"op": "set", "name": "ctl", "rules": [{"action": "drop"}]}))
    )
    assert set_reply["ok"] is True and set_reply["stats"]["rules"] == 1
    listed = json.loads(handle_control(b'{"op": "list"}'))
    assert "ctl" in listed["names"]
    assert json.loads(handle_control(b'{"op": "clear", "name": "ctl"}'))["stats"]["rules"] == 0
    bad = json.loads(handle_control(b'{"op": "set", "name": "ctl", "rules": [{"when": 1}]}'))
    assert bad["ok"] is False and "unknown fields ['when']" in bad["error"]
    missing = json.loads(handle_control(b'{"op": "stats", "name": "nope"}'))
    assert missing["ok"] is False and "no live fault adapter named 'nope'" in missing["error"]
    assert json.loads(handle_control(b"not json"))["ok"] is False


def test_rule_and_config_validation(tmp_path):
    with pytest.raises(ValueError, match="a delay rule needs delay_s > 0"):
        fault_config(tmp_path, "x", rules=[{"action": "delay"}])
    with pytest.raises(ValueError, match=r"rules\[0\].ranks: must be a list of int"):
        fault_config(tmp_path, "x", rules=[{"action": "drop", "ranks": 1}])
    with pytest.raises(ValueError, match="'inner' must be an adapter spec"):
        BsrFaultL2AdapterConfig.from_dict({"type": "bsr_fault"})
    cfg = fault_config(tmp_path, "x")
    assert cfg.inner_config.__class__.__name__ == "BsrFSL2AdapterConfig"
    assert issubclass(BsrFaultL2Adapter, object)


def test_shaped_odirect_fs_tier_costs_the_spec(tmp_path, sm_factory):
    """A shaped bsr_fs tier (O_DIRECT where the filesystem takes it) in the real
    StorageManager: staging 6 chunks from L2 issues loads whose shaped schedule carries
    exactly their bytes at the spec's rate and latency, back to back on one device."""
    from bsrctl.stack.launch.extensions import odirect_allowed

    base = tmp_path / "l2"
    odirect = odirect_allowed(base)
    shape = {"bandwidth_bytes_s": 16 * CHUNK, "latency_s": 0.01}  # 16 chunks/s
    inner = {"type": "bsr_fs", "base_path": str(base), "use_odirect": odirect}
    sm = sm_factory(fault_config(base, "shaped-fs", inner=inner, shape=shape))
    ks = kv.make_keys(6, "s")
    kv.store(sm, ks, CHUNK)
    kv.forget(sm, ks)
    assert fetch(sm, ks).exact == list(range(6))
    report = fault_stats("shaped-fs")["shaping"]
    assert report["shape"] == shape
    assert report["bytes"] == 6 * CHUNK  # every staged byte went through the device
    sched = report["schedule"]
    for i, op in enumerate(sched):
        service_s = 0.01 + op["size_bytes"] / (16 * CHUNK)
        assert op["done_s"] - op["start_s"] == pytest.approx(service_s, abs=2e-6)
        if i:
            assert op["start_s"] == pytest.approx(max(op["submitted_s"], sched[i - 1]["done_s"]))
