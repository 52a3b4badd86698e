"""The install read-back over LMCache's real CPU cache context (no vLLM, no server): a KV
cache registered as vLLM's CPU backend registers it (one [blocks, kv heads, block size,
2 x head dim] tensor per layer, LMCache's NL_X_NB_NH_BS_CS), windows installed by
``MPBlockDestination`` with LMCache's own retrieve copy and read back with its store copy.
One byte of the destination changed after an install is a mismatch, and fails closed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("lmcache")

import torch  # noqa: E402
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj  # noqa: E402
from lmcache.v1.multiprocess.group_view import EngineGroupInfo  # noqa: E402
from lmcache.v1.multiprocess.modules.lmcache_driven_transfer import (  # noqa: E402
    get_layout_desc,
)
from lmcache.v1.platform.base.event_ipc import get_event_ipc_backend  # noqa: E402
from lmcache.v1.platform.cache_context import create_cache_context  # noqa: E402
from lmcache.v1.platform.kv_wrap import _release_partial_kv_wrappers, wrap_kv_caches  # noqa: E402

from bsrkv.lmcache_ext.bsr.mp_storage import MPBlockDestination  # noqa: E402
from bsrkv.restore import (  # noqa: E402
    BoundedRestorer,
    EventKind,
    FailureKind,
    RestoreConfig,
    RestoreRequest,
    RowId,
    RowKeys,
    StageResult,
    Window,
)

CHUNK, BLOCK, NB, LAYERS = 256, 16, 80, 2
BPC = CHUNK // BLOCK  # blocks per chunk


@pytest.fixture
def cpu_context() -> Iterator[Any]:
    gen = torch.Generator().manual_seed(1)
    kv = {f"l{i}": torch.randn(NB, 2, BLOCK, 64, generator=gen) for i in range(LAYERS)}
    wrappers = wrap_kv_caches(kv)
    try:
        yield create_cache_context(
            wrappers, CHUNK, engine_group_infos=[EngineGroupInfo(0, (0, 1), BLOCK, -1)]
        )
    finally:
        _release_partial_kv_wrappers(wrappers)  # unlinks the SHM segments


def staged_objects(ctx: Any, n: int) -> list[TensorMemoryObj]:
    desc = get_layout_desc(ctx, CHUNK, object_group_id=0)
    size = sum(s.numel() * d.itemsize for s, d in zip(desc.shapes, desc.dtypes, strict=True))
    out = []
    for i in range(n):
        raw = torch.randint(
            0, 255, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(i)
        )
        meta = MemoryObjMetadata(
            shape=desc.shapes[0], dtype=desc.dtypes[0], address=0, phy_size=size, ref_count=1,
            shapes=list(desc.shapes), dtypes=list(desc.dtypes),
        )  # fmt: skip
        out.append(TensorMemoryObj(raw, meta, parent_allocator=None))
    return out


class StagedStorage:
    """Every chunk staged already (the objects above); records releases."""

    def __init__(self, objs: list[TensorMemoryObj]) -> None:
        self.objs = objs
        self.released: list[int] = []

    def probe(self, req: RestoreRequest[int]) -> list[list[bool]]:
        return [[True] * req.num_chunks]

    def stage(self, req: RestoreRequest[int], w: Window) -> Window:
        return w

    def wait(self, w: Window, timeout_s: float) -> StageResult:
        return StageResult(((True,) * w.num_chunks,), {})

    @contextmanager
    def read(self, w: Window, n: int) -> Iterator[dict[RowId, list[Any]]]:
        yield {RowId(0, 0): self.objs[w.chunk_start : w.chunk_start + n]}

    def release(self, w: Window) -> None:
        self.released.append(w.index)


def _restore(ctx: Any, n: int, w: int, corrupt_window: int = -1):
    objs = staged_objects(ctx, n)
    block_ids = [list(range(3, 3 + n * BPC))]
    dest = MPBlockDestination(
        cache_context=ctx,
        event_backend=get_event_ipc_backend(ctx.device),
        block_ids=block_ids,
        chunk_tokens=CHUNK,
        skip_first_n_tokens=0,
        transfer_key="t",
    )
    install = dest.install

    def install_then_corrupt(rid: str, win: Window, o: Any, k: int) -> int:
        got = install(rid, win, o, k)
        if win.index == corrupt_window:  # one byte of the last block the window wrote
            block = block_ids[0][win.chunk_stop * BPC - 1]
            ctx.kv_tensors[1][block].view(torch.uint8)[0, 5, 7] ^= 0x40
        return got

    dest.install = install_then_corrupt  # type: ignore[method-assign]
    req = RestoreRequest("r", (RowKeys(RowId(0, 0), tuple(range(n)), objs[0].get_size()),), CHUNK)
    storage = StagedStorage(objs)
    r = BoundedRestorer(storage, RestoreConfig(window_chunks=w, readback=True))
    return r.restore(r.probe(req), dest), storage, objs


def test_windows_read_back_through_lmcaches_store_copy_equal_the_staged_bytes(cpu_context) -> None:
    out, storage, objs = _restore(cpu_context, n=4, w=2)
    assert out.ok and out.cached_chunks == 4 and storage.released == [0, 1]
    assert out.readback is not None
    rb = out.readback.to_json()
    assert {k: rb[k] for k in rb if k != "seconds"} == {
        "windows_checked": 2,
        "chunks_checked": 4,
        "chunks_unchecked": 0,
        "mismatches": 0,
        "scratch_bytes": objs[0].get_size(),  # one chunk of the one object group: c
    }
    assert rb["seconds"] > 0
    kinds = [e.kind for e in out.events if e.window == 1]
    assert kinds[-2:] == [EventKind.READBACK, EventKind.RELEASE]


def test_one_byte_changed_after_an_install_is_a_mismatch_and_fails_closed(cpu_context) -> None:
    out, storage, _ = _restore(cpu_context, n=4, w=2, corrupt_window=1)
    assert (out.ok, out.failure, out.cached_chunks, out.windows_done) == (
        False, FailureKind.READBACK_MISMATCH, 0, 1,
    )  # fmt: skip
    assert out.detail == (
        "window 1 (chunks 2..4): 1 of 2 object(s) read back differ from the staged bytes, "
        "first ['rank 0 group 0 chunk 3']"
    )
    assert storage.released == [0, 1]  # released after the check, nothing left staged
    assert out.readback is not None and out.readback.mismatches == 1
