"""Properties of the BSR core over LMCache's real StorageManager (real L1, real FS L2).

Every figure is exact (bytes, chunks, tokens), measured from the L1 allocator; no timings.

Geometry: TP = 2, two groups, 16-token chunks, one 4 KiB object per (chunk, rank, group)
(16 x 64 float32), so c = 8192 B per rank and L1 allocations (4 KiB-aligned) are exact.
(The pure-core tests, which need no LMCache, are in tests/bsrkv/restore.)
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("lmcache")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bsrctl.stack.storage import (  # noqa: E402
    FAULT_KINDS,
    CanonicalKV,
    FaultSpec,
    StorageStack,
    StorageStackConfig,
    deploy,
    restore_with_fault,
)
from bsrkv.registration import GroupSpec, Registration, TensorSpec  # noqa: E402
from bsrkv.restore import MarkerState, RestoreConfig  # noqa: E402
from bsrkv.settings import RestoreSettings  # noqa: E402

CHUNK_TOKENS = 16

_ids = itertools.count()


def small_registration(tp_size: int = 2, aux_bytes: int = 0) -> Registration:
    tensors = (
        TensorSpec("layers.0.kv", (CHUNK_TOKENS, 64), "float32", 0),
        TensorSpec("layers.0.index", (CHUNK_TOKENS, 64), "float32", 1),
    )
    groups = (GroupSpec(0, "attention"), GroupSpec(1, "indexer"))
    return Registration("bsr-test", tensors, groups, tp_size, CHUNK_TOKENS, aux_bytes)


@pytest.fixture(scope="module")
def reg() -> Registration:
    return small_registration()


def make_stack(
    root: Path, reg: Registration, l1_chunks: int, staging: str = "direct"
) -> StorageStack:
    return deploy(
        StorageStackConfig(
            root_dir=root,
            registration=reg,
            l1_capacity_bytes=l1_chunks * reg.bytes_per_chunk,
            restore=RestoreSettings(window_timeout_s=10.0, window_staging=staging),
        )
    )


@pytest.fixture
def stack_factory(tmp_path: Path, reg: Registration) -> Iterator[object]:
    """make(l1_chunks) -> a stack under tmp_path; torn down after the test."""
    made: list[StorageStack] = []

    def make(l1_chunks: int) -> StorageStack:
        made.append(make_stack(tmp_path / f"s{len(made)}", reg, l1_chunks))
        return made[-1]

    yield make
    for s in made:
        s.teardown()


@pytest.fixture(scope="module", params=["direct", "prefetch"])
def big_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, reg: Registration
) -> Iterator[StorageStack]:
    """L1 of 64 chunks per rank: room for any window/budget the properties draw; windows
    staged directly (the default) or by LMCache's prefetch: every property holds for both."""
    stack = make_stack(tmp_path_factory.mktemp("bsr-big"), reg, 64, request.param)
    yield stack
    stack.teardown()


faults = st.one_of(st.none(), st.tuples(st.sampled_from(FAULT_KINDS), st.integers(0, 30)))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    n=st.integers(1, 20),
    w=st.integers(1, 5),
    extra=st.integers(0, 6),
    fault=faults,
)
def test_bounded_restore(big_stack: StorageStack, reg: Registration, n, w, extra, fault) -> None:
    b = w + extra
    c = reg.bytes_per_chunk
    big_stack.seed(n * CHUNK_TOKENS, "prop")  # rewrites any object a drop_key removed
    spec = None
    if fault is not None:
        spec = FaultSpec(fault[0], window=fault[1] % math.ceil(n / w), rank=fault[1] % 2)
    before = big_stack.l1_usage_bytes()
    rid = f"p{next(_ids)}"
    if spec is None:
        res = big_stack.restore(w, b, request_id=rid)
    else:
        res = restore_with_fault(big_stack, spec, w, b, request_id=rid)

    assert res.restore_pool_peak_bytes <= b * c + reg.aux_bytes
    assert res.l1_usage_after_bytes == before  # everything staged was released
    if spec is None:
        assert res.ok and res.cached_tokens == res.expected_cached_tokens == n * CHUNK_TOKENS
        assert res.bytes_restored == n * c * reg.tp_size  # restored bytes == stored bytes
        assert res.verify_ok and res.verify_mismatches == 0
        assert res.blocks_valid == res.blocks_total == n * 2 * reg.tp_size
        one_window = min(w, n) * c
        if b < 2 * w:  # paper mode: exactly one window live, whatever N
            assert res.restore_pool_peak_bytes_by_rank == {0: one_window, 1: one_window}
            assert res.gauge_peak_bytes_by_rank == {0: one_window, 1: one_window}
        else:  # pipelined: at most two windows live
            assert one_window <= res.restore_pool_peak_bytes <= min(2 * w, n) * c
    else:
        assert res.failure.startswith(
            {"drop_key": "MISSING_KEY", "timeout": "TIMEOUT", "install_error": "INSTALL_ERROR"}[
                spec.kind
            ]
        )
        assert res.cached_tokens == 0 and res.blocks_valid == 0


def test_peak_is_independent_of_n_and_whole_plan_grows(big_stack: StorageStack, reg) -> None:
    c = reg.bytes_per_chunk
    bounded, whole = [], []
    for n in (4, 12, 24):
        big_stack.seed(n * CHUNK_TOKENS, "indep")
        big_stack.forget()
        r = big_stack.restore(2, 2, request_id=f"i{n}")
        assert r.ok and r.cached_tokens == n * CHUNK_TOKENS
        bounded.append(r.restore_pool_peak_bytes)
        r0 = big_stack.restore(0, request_id=f"i0-{n}")
        assert r0.ok and r0.cached_tokens == n * CHUNK_TOKENS and r0.verify_ok
        whole.append(r0.restore_pool_peak_bytes)
    assert bounded == [2 * c] * 3
    assert whole == [4 * c, 12 * c, 24 * c]


def test_l1_returns_to_a_nonzero_prior_usage(big_stack: StorageStack, reg) -> None:
    big_stack.seed(3 * CHUNK_TOKENS, "resident", into_l1=True)
    base = big_stack.l1_usage_bytes()
    assert base == {0: 3 * reg.bytes_per_chunk, 1: 3 * reg.bytes_per_chunk}
    big_stack.seed(10 * CHUNK_TOKENS, "other")
    ok = big_stack.restore(3, 3, request_id="nz-ok")
    bad = restore_with_fault(big_stack, FaultSpec("drop_key", 2, rank=1), 3, 6, request_id="nz-bad")
    assert ok.ok and not bad.ok
    assert ok.l1_usage_after_bytes == bad.l1_usage_after_bytes == base


def test_stock_whole_plan_gets_nothing_when_the_plan_exceeds_l1(stack_factory, reg) -> None:
    stack = stack_factory(8)
    stack.seed(12 * CHUNK_TOKENS, "small-l1")
    stock = stack.restore(0, request_id="stock")
    bsr = stack.restore(2, 2, request_id="bsr")
    # stock: the batch reservation of the whole plan fails (one group row may fit before
    # the next does not), the prefetch reports no complete prefix: 0 hits
    assert stock.ok and stock.cached_tokens == 0 and stock.bytes_restored == 0
    assert stock.restore_pool_peak_bytes <= 8 * reg.bytes_per_chunk
    assert stock.l1_usage_after_bytes == {0: 0, 1: 0}
    assert bsr.ok and bsr.cached_tokens == 12 * CHUNK_TOKENS and bsr.verify_ok
    assert bsr.restore_pool_peak_bytes == 2 * reg.bytes_per_chunk


def test_one_invalid_rank_group_collapses_the_prefix(big_stack: StorageStack, reg) -> None:
    big_stack.seed(6 * CHUNK_TOKENS, "hma")
    # (rank 1, group 1) lost its first chunk in L2: nothing of the prefix is advertised
    req = big_stack.request("hma-probe", CanonicalKV(reg, "hma").chunk_hashes(6))
    big_stack.path_of(req.rows[3].keys[0]).unlink()
    r = big_stack.restore(2, 2, request_id="hma-1")
    assert r.ok and r.cached_tokens == 0 and r.blocks_valid == 0 and r.bytes_restored == 0
    # a one-rank fault mid-restore invalidates every block, rank 0's included
    big_stack.seed(6 * CHUNK_TOKENS, "hma")
    r = restore_with_fault(
        big_stack, FaultSpec("drop_key", 1, rank=1, group=1), 2, 2, request_id="hma-2"
    )
    assert r.failure.startswith("MISSING_KEY") and r.windows_done == 1
    assert r.cached_tokens == 0 and r.blocks_valid == 0


def test_force_local_marker_lifecycle(big_stack: StorageStack, reg) -> None:
    big_stack.seed(6 * CHUNK_TOKENS, "fl")
    failed = restore_with_fault(big_stack, FaultSpec("timeout", 1), 2, 2, request_id="fl")
    assert failed.failure.startswith("TIMEOUT")
    assert big_stack.markers.state("fl") == MarkerState.FORCED
    local = big_stack.restore(2, 2, request_id="fl")  # next admission pass: 0 external
    assert local.ok and local.forced_local and local.cached_tokens == 0
    assert local.restore_pool_peak_bytes == 0
    assert big_stack.markers.state("fl") == MarkerState.CLEAR  # cleared on admission
    again = big_stack.restore(2, 2, request_id="fl")
    assert again.cached_tokens == 6 * CHUNK_TOKENS and not again.forced_local
    restore_with_fault(big_stack, FaultSpec("install_error", 0), 2, 2, request_id="fl-td")
    restorer = big_stack.make_restorer(RestoreConfig(window_chunks=2))
    restorer.on_teardown("fl-td")
    assert big_stack.markers.state("fl-td") == MarkerState.CLEAR


def test_concurrent_requests_share_one_budget(big_stack: StorageStack, reg) -> None:
    c, n, budget = reg.bytes_per_chunk, 9, 5
    salts = [f"cc{i}" for i in range(3)]
    for s in salts:
        big_stack.seed(n * CHUNK_TOKENS, s)
    restorer = big_stack.make_restorer(
        RestoreConfig(window_chunks=2, admission_budget_chunks=budget)
    )
    before = big_stack.l1_usage_bytes()
    big_stack.reset_peaks()
    outs, dests = [], []

    def run(salt: str) -> None:
        req = big_stack.request(f"cc-{salt}", CanonicalKV(reg, salt).chunk_hashes(n))
        dest = big_stack.destination(req, salt)
        dests.append(dest)
        outs.append(restorer.restore(restorer.probe(req), dest))

    threads = [threading.Thread(target=run, args=(s,)) for s in salts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outs) == 3 and all(o.ok and o.cached_chunks == n for o in outs)
    assert all(d.mismatches == 0 and d.blocks_valid == n * 4 for d in dests)
    for rank, hw in big_stack.high_water.items():
        assert hw.peak_bytes - before[rank] <= budget * c
    assert restorer.gauge.peak_max_bytes() <= budget * c
    assert big_stack.l1_usage_bytes() == before
