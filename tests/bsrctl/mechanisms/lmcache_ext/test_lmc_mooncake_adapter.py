"""bsrctl's Mooncake L2 adapter against a real mooncake_master + mooncake_client.

The adapter runs in LMCache's StorageManager (real L1, the adapter as the only L2) inside
a driver process in the Mooncake namespace. A miss is never a hit: when the master or the
node is down, lookups and loads report 0 hits and L1 is left empty.
"""

from __future__ import annotations

import pytest

from bsrkv.lmcache_ext.adapters.mooncake import (
    BsrMooncakeL2Adapter,
    BsrMooncakeL2AdapterConfig,
    mooncake_key,
)

CHUNK = 256 * 1024
N = 8


def init(driver, stack, **extra) -> dict:
    spec = {"type": "bsr_mooncake", "master_server_address": stack.endpoints.master_address}
    spec.update(extra)
    return driver.request(op="init", adapters=[spec], l1_bytes=32 * 1024 * 1024, chunk_bytes=CHUNK)


@pytest.mark.mooncake
def test_put_get_and_miss(mooncake, driver_factory):
    d = driver_factory()
    init(d, mooncake)
    d.request(op="store", salt="a", n=N)
    assert d.request(op="forget", salt="a", n=N)["l1_used"] == 0

    assert d.request(op="lookup", salt="a", n=N)["present"] == list(range(N))
    assert d.request(op="lookup", salt="never-stored", n=N)["present"] == []

    load = d.request(op="load", salt="a", n=N)
    assert (load["loaded"], load["exact"]) == (list(range(N)), list(range(N)))

    got = d.request(op="prefetch", salt="a", n=N + 4)  # 8 stored keys, then 4 never stored
    assert got["completed"] is True
    assert got["hits"] == list(range(N))
    assert got["l2_hits"] == list(range(N))
    assert got["l1_hits"] == []
    assert got["exact"] == list(range(N))  # bytes equal the regenerated canonical bytes

    miss = d.request(op="prefetch", salt="never-stored", n=N)
    assert (miss["completed"], miss["hits"]) == (True, [])
    assert miss["l1_used_after"] == 0

    status = d.request(op="status")["status"][0]
    assert status["is_healthy"] is True
    assert status["counters"]["stored"] == N
    assert status["counters"]["loaded"] == 2 * N  # the adapter-level load, then the prefetch


@pytest.mark.mooncake
def test_master_down_is_a_miss_never_a_hit(mooncake, driver_factory):
    d = driver_factory()
    init(d, mooncake)
    d.request(op="store", salt="m", n=N)
    d.request(op="forget", salt="m", n=N)

    assert d.request(op="lookup", salt="m", n=N)["present"] == list(range(N))

    mooncake.stop_master(timeout_s=5.0)
    assert not mooncake.master.alive()

    # the load path alone (as when the master dies between lookup and load)
    load = d.request(op="load", salt="m", n=N)
    assert (load["loaded"], load["exact"]) == ([], [])
    lookup = d.request(op="lookup", salt="m", n=N)
    assert lookup["present"] == []
    got = d.request(op="prefetch", salt="m", n=N, timeout_s=30.0)
    assert got["completed"] is True
    assert got["hits"] == [] and got["l2_hits"] == []
    assert got["l1_used_after"] == 0
    status = d.request(op="status")["status"][0]
    assert status["is_healthy"] is False
    assert status["master_reachable"] is False
    assert status["counters"]["loaded"] == 0
    assert status["counters"]["last_error_code"] < 0
    print(
        f"master down: load {load['elapsed_s']:.2f} s, lookup {lookup['elapsed_s']:.2f} s, "
        f"prefetch {got['elapsed_s']:.2f} s, last code {status['counters']['last_error_code']}"
    )


@pytest.mark.mooncake
def test_storage_node_down_is_a_miss(mooncake, driver_factory):
    d = driver_factory()
    init(d, mooncake)
    d.request(op="store", salt="n", n=N)
    d.request(op="forget", salt="n", n=N)

    mooncake.stop_node(timeout_s=5.0)
    load = d.request(op="load", salt="n", n=N)
    assert (load["loaded"], load["exact"]) == ([], [])
    got = d.request(op="prefetch", salt="n", n=N, timeout_s=30.0)
    assert got["completed"] is True
    assert got["hits"] == []
    assert got["exact"] == []
    assert got["l1_used_after"] == 0


def test_config_validation():
    cfg = BsrMooncakeL2AdapterConfig.from_dict(
        {"type": "bsr_mooncake", "master_server_address": "127.0.0.1:5"}
    )
    assert (cfg.protocol, cfg.metadata_server, cfg.global_segment_size) == (
        "tcp",
        "P2PHANDSHAKE",
        0,
    )
    with pytest.raises(ValueError, match="master_server_address is required"):
        BsrMooncakeL2AdapterConfig.from_dict({"type": "bsr_mooncake"})
    with pytest.raises(ValueError, match=r"unknown bsr_mooncake fields \['mastr'\]"):
        BsrMooncakeL2AdapterConfig.from_dict({"master_server_address": "h:1", "mastr": 1})
    with pytest.raises(ValueError, match="expected 'host:port'"):
        BsrMooncakeL2AdapterConfig.from_dict({"master_server_address": "nohost"})
    with pytest.raises(ValueError, match="load_workers: expected int"):
        BsrMooncakeL2AdapterConfig.from_dict({"master_server_address": "h:1", "load_workers": "2"})


def test_key_names_are_stable():
    from lmcache.v1.distributed.api import ObjectKey

    key = ObjectKey(chunk_hash=bytes.fromhex("00ff"), model_name="org/m", kv_rank=0x01010101)
    assert mooncake_key(key, "bsr") == "bsr@org-SEP-m@0x01010101@0@00ff"


@pytest.mark.mooncake
def test_fault_adapter_over_mooncake_drops_a_rank_and_verifies(mooncake, driver_factory):
    """The fault wrapper composes with the Mooncake tier: a rank's keys dropped at load, and
    an object corrupted inside Mooncake itself (upsert of flipped bytes) caught by verify."""
    d = driver_factory()
    inner = {"type": "bsr_mooncake", "master_server_address": mooncake.endpoints.master_address}
    spec = {"type": "bsr_fault", "name": "mc", "inner": inner, "verify": True}
    d.request(op="init", adapters=[spec], l1_bytes=32 * 1024 * 1024, chunk_bytes=CHUNK)
    d.request(op="store", salt="v", n=N)
    d.request(op="forget", salt="v", n=N)

    corrupt = d.request(op="mc_corrupt", salt="v", n=N, index=6, offset=100)
    assert (corrupt["upsert"], corrupt["size"]) == (0, CHUNK)
    got = d.request(op="prefetch", salt="v", n=N)
    assert got["hits"] == [0, 1, 2, 3, 4, 5, 7]
    assert got["exact"] == got["hits"]

    rules = [{"action": "drop", "positions": [0, 1]}]
    stats = d.request(op="fault", control={"op": "set", "name": "mc", "rules": rules})["stats"]
    assert stats["verify_mismatch"] == 1
    got = d.request(op="prefetch", salt="v", n=N)
    assert got["hits"] == [2, 3, 4, 5, 7]
    assert got["l1_used_after"] == 0
    final = d.request(op="fault", control={"op": "stats", "name": "mc"})["stats"]
    assert (final["dropped_keys"], final["verify_mismatch"]) == (2, 2)


def test_close_twice_is_a_no_op():
    pytest.importorskip("mooncake.store")

    class Store:  # the adapter's only use of it here is close()
        closes = 0

        def close(self) -> None:
            Store.closes += 1

    cfg = BsrMooncakeL2AdapterConfig.from_dict({"master_server_address": "127.0.0.1:5"})
    adapter = BsrMooncakeL2Adapter(cfg, store=Store())
    adapter.close()
    adapter.close()
    assert Store.closes == 1
