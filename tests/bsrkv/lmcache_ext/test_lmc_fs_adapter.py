"""bsrctl's FS L2 adapter in LMCache's real StorageManager (real L1, real files)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import lmcext_kv as kv
import pytest
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import (
    FSL2AdapterConfig,
    _object_key_to_filename,
)
from lmcache.v1.distributed.l2_adapters.plugin_l2_adapter import PluginL2AdapterConfig

from bsrkv.lmcache_ext.adapters.fileio import read_odirect
from bsrkv.lmcache_ext.adapters.fs import (
    ENV_LOAD_CONCURRENCY,
    BsrFSL2Adapter,
    BsrFSL2AdapterConfig,
)

CHUNK = 2 * 1024 * 1024  # large enough that four reads overlap
L1 = 64 * 1024 * 1024
N = 16


def fs_config(base: Path, **extra) -> BsrFSL2AdapterConfig:
    return BsrFSL2AdapterConfig.from_dict({"type": "bsr_fs", "base_path": str(base), **extra})


def data_file(base: Path, key) -> Path:
    return base / _object_key_to_filename(key)


def seed(base: Path, keys, **extra) -> None:
    sm = kv.build_sm([fs_config(base, **extra)], L1)
    try:
        kv.store(sm, keys, CHUNK)
    finally:
        sm.close()


def fetch_fresh(config, keys):
    """A new StorageManager over the same files: every hit must come from L2."""
    sm = kv.build_sm([config], L1)
    try:
        got = kv.prefetch(sm, keys, CHUNK)
        status = kv.adapters(sm)[0].report_status()
        assert sm.get_l1_usage()[0] == 0  # prefetch_policy default: nothing left pinned
        return got, status
    finally:
        sm.close()


def test_concurrency_1_and_4_give_identical_bytes_and_bitmaps(tmp_path):
    keys = kv.make_keys(N, "conc")
    seed(tmp_path, keys, checksum=True)
    data_file(tmp_path, keys[3]).unlink()  # missing
    os.truncate(data_file(tmp_path, keys[9]), CHUNK - 4096)  # truncated
    expected = [i for i in range(N) if i not in (3, 9)]

    runs = {}
    for conc in (1, 4):
        got, status = fetch_fresh(fs_config(tmp_path, load_concurrency=conc, checksum=True), keys)
        runs[conc] = (got, status)
        assert got.completed
        assert got.hits == expected
        assert got.l2_hits == expected
        assert got.exact == expected
        assert status["load_concurrency"] == conc
        counters = status["counters"]
        # the missing file already fails the lookup, so it is never loaded
        assert (counters["loaded"], counters["missing"], counters["size_mismatch"]) == (14, 0, 1)

    assert runs[1][0].digests == runs[4][0].digests
    assert runs[1][1]["counters"]["peak_inflight_loads"] == 1
    assert 2 <= runs[4][1]["counters"]["peak_inflight_loads"] <= 4
    print(
        f"{N} x {CHUNK >> 20} MiB from page cache: "
        f"conc1 {runs[1][0].elapsed_s * 1e3:.1f} ms, conc4 {runs[4][0].elapsed_s * 1e3:.1f} ms"
    )


def test_on_disk_format_is_the_stock_one(tmp_path):
    keys = kv.make_keys(6, "fmt")
    seed(tmp_path, keys, load_concurrency=3)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(_object_key_to_filename(k) for k in keys)  # no sidecars
    assert all((tmp_path / n).stat().st_size == CHUNK for n in names)

    stock, _ = fetch_fresh(FSL2AdapterConfig(base_path=str(tmp_path)), keys)
    assert stock.exact == list(range(6))

    stock_dir = tmp_path / "stock"
    sm = kv.build_sm([FSL2AdapterConfig(base_path=str(stock_dir))], L1)
    try:
        kv.store(sm, keys, CHUNK)
    finally:
        sm.close()
    ours, _ = fetch_fresh(fs_config(stock_dir, load_concurrency=2), keys)
    assert ours.exact == list(range(6))

    # checksum on over files the stock adapter wrote (no sidecars): misses, not hits
    checked, status = fetch_fresh(fs_config(stock_dir, checksum=True), keys)
    assert checked.hits == []
    assert status["counters"]["checksum_missing"] == 6


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_corrupted_object_is_detected_before_install(tmp_path, algorithm):
    keys = kv.make_keys(8, "corrupt")
    seed(tmp_path, keys, checksum=True, checksum_algorithm=algorithm)
    files = sorted(p.name for p in tmp_path.glob(_object_key_to_filename(keys[5]) + "*"))
    assert files == [_object_key_to_filename(keys[5]) + s for s in ("", "." + algorithm)]
    path = data_file(tmp_path, keys[5])
    raw = bytearray(path.read_bytes())
    raw[12345] ^= 0x01  # one flipped bit, size unchanged
    path.write_bytes(raw)

    checked = fs_config(tmp_path, checksum=True, checksum_algorithm=algorithm, load_concurrency=4)
    got, status = fetch_fresh(checked, keys)
    assert got.hits == [0, 1, 2, 3, 4, 6, 7]
    assert got.exact == got.hits
    assert status["counters"]["checksum_mismatch"] == 1
    assert status["counters"]["loaded"] == 7

    # prefix policy (what a restore uses): the prefix stops before the corrupt chunk
    sm = kv.build_sm([fs_config(tmp_path, checksum=True, checksum_algorithm=algorithm)], L1)
    try:
        prefix = kv.prefetch(sm, keys, CHUNK, policy="prefix")
        assert prefix.hits == [0, 1, 2, 3, 4]
        adapter = kv.adapters(sm)[0]
        assert adapter.corrupt_keys() == [path.name]
    finally:
        sm.close()

    # without checksums the flipped bit is served as a hit with wrong bytes
    blind, _ = fetch_fresh(fs_config(tmp_path), keys)
    assert blind.hits == list(range(8))
    assert 5 not in blind.exact


def test_a_sidecar_of_another_algorithm_is_not_read(tmp_path):
    """Objects stored with sha256 sidecars, loaded by an xxh3_128 adapter: every load is a
    checksum_missing miss, never a hit checked against the wrong digest."""
    keys = kv.make_keys(3, "algo")
    seed(tmp_path, keys, checksum=True, checksum_algorithm="sha256")
    got, status = fetch_fresh(fs_config(tmp_path, checksum=True), keys)
    assert got.hits == []
    assert status["counters"]["checksum_missing"] == 3
    assert status["checksum_algorithm"] == "xxh3_128"


def test_an_unknown_checksum_algorithm_is_refused(tmp_path):
    with pytest.raises(
        ValueError, match=r"checksum_algorithm 'md5': one of \['xxh3_128', 'sha256'\]"
    ):
        fs_config(tmp_path, checksum=True, checksum_algorithm="md5")


def test_odirect_reads(tmp_path):
    keys = kv.make_keys(6, "odirect")
    seed(tmp_path, keys, checksum=True, use_odirect=True)
    got, status = fetch_fresh(
        fs_config(tmp_path, checksum=True, use_odirect=True, load_concurrency=2), keys
    )
    assert got.exact == list(range(6))
    assert status["use_odirect"] is True


@pytest.mark.parametrize("size", [5000, 8192])
def test_odirect_read_aligned_and_bounced(tmp_path, size):
    path = tmp_path / "obj.data"
    payload = os.urandom(size)
    path.write_bytes(payload)
    dst = bytearray(size)  # heap buffer: unaligned address, so the bounce buffer is used
    assert read_odirect(path, dst) == size
    assert bytes(dst) == payload
    with mmap.mmap(-1, size) as aligned:  # page-aligned destination
        assert read_odirect(path, aligned) == size
        assert aligned[:] == payload
    assert read_odirect(path, bytearray(size + 1)) == -1  # size mismatch


def test_load_concurrency_from_env_and_validation(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_LOAD_CONCURRENCY, "3")
    assert fs_config(tmp_path).load_concurrency == 3
    assert fs_config(tmp_path, load_concurrency=5).load_concurrency == 5  # field wins
    monkeypatch.setenv(ENV_LOAD_CONCURRENCY, "zero")
    with pytest.raises(ValueError, match=ENV_LOAD_CONCURRENCY):
        fs_config(tmp_path)
    monkeypatch.delenv(ENV_LOAD_CONCURRENCY)
    assert fs_config(tmp_path).load_concurrency == 1
    with pytest.raises(ValueError, match="load_concurrency must be >= 1"):
        fs_config(tmp_path, load_concurrency=0)
    with pytest.raises(ValueError, match=r"unknown bsr_fs adapter fields \['load_concurency'\]"):
        fs_config(tmp_path, load_concurency=2)


def test_loads_through_the_stock_plugin_type(tmp_path):
    """The server's path: --l2-adapter '{"type": "plugin", ...}' builds our adapter."""
    spec = {
        "type": "plugin",
        "module_path": "bsrkv.lmcache_ext.adapters.fs",
        "class_name": "BsrFSL2Adapter",
        "adapter_params": {"base_path": str(tmp_path), "load_concurrency": 4, "checksum": True},
    }
    config = PluginL2AdapterConfig.from_dict(spec)
    keys = kv.make_keys(4, "plugin")
    sm = kv.build_sm([config], L1)
    try:
        adapter = kv.adapters(sm)[0]
        assert type(adapter) is BsrFSL2Adapter
        assert adapter.report_status()["load_concurrency"] == 4
        kv.store(sm, keys, CHUNK)
        kv.forget(sm, keys)
        assert kv.prefetch(sm, keys, CHUNK).exact == [0, 1, 2, 3]
    finally:
        sm.close()


def test_close_twice_is_a_no_op(tmp_path):
    adapter = BsrFSL2Adapter(fs_config(tmp_path / "l2", load_concurrency=2))
    adapter.close()
    adapter.close()  # as LMCache's stock FS adapter tolerates it
    assert adapter._load_pool._shutdown


def test_lookup_finds_exactly_what_the_stock_lookup_finds_in_one_round_trip(tmp_path, monkeypatch):
    """bit i iff key i's data file exists, as LMCache's FSL2Adapter reports; the checks
    are one executor call per task (the stock loop makes one per key)."""
    from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2Adapter

    keys = kv.make_keys(8, "lookup")
    for i in (0, 2, 3, 7):
        data_file(tmp_path, keys[i]).write_bytes(b"\0" * 4096)
    stock = FSL2Adapter(FSL2AdapterConfig(base_path=str(tmp_path)))
    bsr = BsrFSL2Adapter(fs_config(tmp_path))
    calls: list[int] = []
    existing = bsr._existing
    monkeypatch.setattr(bsr, "_existing", lambda ks: calls.append(len(ks)) or existing(ks))
    try:
        assert kv.adapter_lookup(stock, keys) == kv.adapter_lookup(bsr, keys) == [0, 2, 3, 7]
        assert kv.adapter_lookup(bsr, keys[4:]) == [3]
        assert calls == [8, 4]
    finally:
        stock.close()
        bsr.close()


def test_a_lookup_whose_check_raises_completes_as_all_misses(tmp_path, monkeypatch):
    keys = kv.make_keys(3, "lookup-raises")
    for k in keys:
        data_file(tmp_path, k).write_bytes(b"\0" * 4096)
    bsr = BsrFSL2Adapter(fs_config(tmp_path))

    def boom(ks):
        raise PermissionError("stat refused")

    monkeypatch.setattr(bsr, "_existing", boom)
    try:
        assert kv.adapter_lookup(bsr, keys, timeout_s=10.0) == []
    finally:
        bsr.close()
