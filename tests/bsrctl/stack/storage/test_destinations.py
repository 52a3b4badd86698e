"""The destination pool checks every installed object against canonical bytes (verify), keeps
a file-backed copy (mmap) or an anonymous one (memory), both compared after the restore, or
only counts (null); an injected install error (a wrapper from ``storage.faults``) strikes
its window."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("lmcache")

from bsrctl.registration.tiny import tiny_llama_cpu  # noqa: E402
from bsrctl.stack.storage import CanonicalKV, InjectedInstallError, PoolDestination  # noqa: E402
from bsrctl.stack.storage.faults import FailingInstall  # noqa: E402
from bsrkv.restore import RestoreRequest, RowId, RowKeys, Window  # noqa: E402

REG = tiny_llama_cpu()
C = REG.bytes_per_chunk
ROW = RowId(0, 0)


def setup(mode: str, tmp_path: Path):
    canon = CanonicalKV(REG, "s0")
    hashes = canon.chunk_hashes(2)
    req = RestoreRequest("r", (RowKeys(ROW, ("k0", "k1"), C),), REG.chunk_tokens)
    dest = PoolDestination(mode, canon, req, hashes, tmp_path)
    objs = [SimpleNamespace(byte_array=canon.object_bytes(h, 0, 0).copy()) for h in hashes]
    return dest, objs


def test_verify_counts_non_canonical_objects(tmp_path: Path) -> None:
    dest, objs = setup("verify", tmp_path)
    objs[1].byte_array[7] ^= 1
    assert dest.install("r", Window(0, 0, 2), {ROW: objs}, 2) == 2 * C
    assert (dest.mismatches, dest.blocks_valid, dest.blocks_total) == (1, 2, 2)
    dest.mark_invalid("r")
    assert dest.blocks_valid == 0


def test_mmap_keeps_a_copy_and_close_removes_it(tmp_path: Path) -> None:
    dest, objs = setup("mmap", tmp_path)
    dest.install("r", Window(1, 1, 2), {ROW: objs[1:]}, 1)
    dest.sync("r")
    pool = np.fromfile(tmp_path / "r.pool", dtype=np.uint8)
    assert pool.size == 2 * C
    assert (pool[C:] == objs[1].byte_array).all() and not pool[:C].any()
    dest.close()
    assert not (tmp_path / "r.pool").exists()


def test_install_error_strikes_its_window_only(tmp_path: Path) -> None:
    """The fault wraps the pool (the pool itself knows no fault)."""
    pool, objs = setup("null", tmp_path)
    dest = FailingInstall(pool, window=1)
    assert dest.install("r", Window(0, 0, 1), {ROW: objs[:1]}, 1) == C
    with pytest.raises(InjectedInstallError, match="window 1"):
        dest.install("r", Window(1, 1, 2), {ROW: objs[1:]}, 1)
    assert pool.blocks_valid == 1
    dest.mark_invalid("r")
    assert pool.blocks_valid == 0


def test_an_object_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    dest, _ = setup("null", tmp_path)
    short = SimpleNamespace(byte_array=np.zeros(C - 1, dtype=np.uint8))
    with pytest.raises(ValueError, match=f"chunk 0: object of {C - 1} bytes, expected {C}"):
        dest.install("r", Window(0, 0, 1), {ROW: [short]}, 1)


N = 4  # chunks of the property's request


@settings(max_examples=25, deadline=None)
@given(
    mode=st.sampled_from(["verify", "memory", "mmap"]),
    bad=st.sets(st.tuples(st.integers(0, N - 1), st.integers(0, C - 1)), max_size=N),
    installed=st.integers(0, N),
)
def test_exactly_the_installed_objects_that_differ_are_mismatched(
    tmp_path_factory: pytest.TempPathFactory, mode: str, bad: set, installed: int
) -> None:
    """verify while installing, memory and mmap after the restore (``compare_pool``): the
    same (row, chunk) set, every bad object installed and no other; none not installed."""
    canon = CanonicalKV(REG, "s0")
    hashes = canon.chunk_hashes(N)
    req = RestoreRequest(
        "p", (RowKeys(ROW, tuple(f"k{i}" for i in range(N)), C),), REG.chunk_tokens
    )
    dest = PoolDestination(mode, canon, req, hashes, tmp_path_factory.mktemp("pool"))
    objs = [SimpleNamespace(byte_array=canon.object_bytes(h, 0, 0).copy()) for h in hashes]
    for chunk, at in bad:
        objs[chunk].byte_array[at] ^= 0x5A
    if installed:
        dest.install("p", Window(0, 0, installed), {ROW: objs[:installed]}, installed)
    assert dest.compares and (dest.mismatched == [] or mode == "verify")
    dest.compare_pool()
    want = sorted({(ROW, c) for c, _ in bad if c < installed}, key=lambda rc: rc[1])
    assert sorted(dest.mismatched, key=lambda rc: rc[1]) == want
    assert dest.mismatches == len(want)
    dest.close()


def test_null_compares_nothing(tmp_path: Path) -> None:
    dest, objs = setup("null", tmp_path)
    objs[0].byte_array[0] ^= 1
    dest.install("r", Window(0, 0, 2), {ROW: objs}, 2)
    dest.compare_pool()
    assert (dest.compares, dest.mismatched) == (False, [])
