"""A restore's faults wrap its storage and destination from outside (``storage.faults``):
over in-memory sides and the real BSR core, each strikes its window and nothing else, and
the core fails closed the way the storage stack's cells rely on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from bsrctl.errors import BadInput
from bsrctl.stack.storage.faults import FailingInstall, FaultSpec, FaultyStorage
from bsrkv.restore import (
    BoundedRestorer,
    FailureKind,
    RestoreConfig,
    RestoreRequest,
    RowId,
    RowKeys,
    StageResult,
    Window,
)

ROWS = (RowId(0, 0), RowId(1, 0))


def request(n: int) -> RestoreRequest[str]:
    rows = tuple(RowKeys(r, tuple(f"{r.rank}/{i}" for i in range(n)), 100) for r in ROWS)
    return RestoreRequest("r", rows, 16)


class Store:
    """Every key present unless dropped; records the calls in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.dropped: set[str] = set()

    def probe(self, req: RestoreRequest[str]) -> list[list[bool]]:
        self.calls.append("probe")
        return [[k not in self.dropped for k in r.keys] for r in req.rows]

    def stage(self, req: RestoreRequest[str], w: Window) -> tuple[RestoreRequest[str], Window]:
        self.calls.append(f"stage {w.index}")
        return (req, w)

    def wait(self, ticket: Any, timeout_s: float) -> StageResult | None:
        req, w = ticket
        self.calls.append(f"wait {w.index}")
        keys = [r.keys[w.chunk_start : w.chunk_stop] for r in req.rows]
        return StageResult(tuple(tuple(k not in self.dropped for k in ks) for ks in keys), {})

    @contextmanager
    def read(self, ticket: Any, n: int) -> Iterator[dict[RowId, list[str]]]:
        req, w = ticket
        yield {r.row: list(r.keys[w.chunk_start : w.chunk_start + n]) for r in req.rows}

    def release(self, ticket: Any) -> None:
        self.calls.append(f"release {ticket[1].index}")


class Dest:
    def __init__(self) -> None:
        self.windows: list[int] = []
        self.invalidated = 0

    def install(self, rid: str, w: Window, objects: Any, n: int) -> int:
        self.windows.append(w.index)
        return 100 * n * len(objects)

    def sync(self, rid: str) -> None:
        pass

    def mark_invalid(self, rid: str) -> None:
        self.invalidated += 1


def restore(storage: Any, dest: Any, n: int = 6, w: int = 2) -> Any:
    restorer = BoundedRestorer(storage, RestoreConfig(window_chunks=w, window_timeout_s=1.0))
    req = request(n)
    return restorer.restore(restorer.probe(req), dest)


def test_a_timeout_strikes_its_window_and_the_prefetch_is_still_released() -> None:
    inner, dest = Store(), Dest()
    out = restore(FaultyStorage(inner, timeout_window=1), dest)
    assert out.failure == FailureKind.TIMEOUT and out.cached_chunks == 0
    assert dest.windows == [0] and dest.invalidated == 1
    assert "wait 1" not in inner.calls  # the wrapper answered: window 1 timed out
    assert "release 1" in inner.calls and "release 0" in inner.calls


def test_a_dropped_key_after_the_probe_is_a_missing_key_at_its_window() -> None:
    inner, dest = Store(), Dest()
    storage = FaultyStorage(inner, after_probe=lambda: inner.dropped.add("1/4"))
    out = restore(storage, dest)
    assert inner.calls[0] == "probe" and inner.dropped == {"1/4"}
    assert out.failure == FailureKind.MISSING_KEY and out.windows_done == 2
    assert dest.windows == [0, 1] and dest.invalidated == 1


def test_an_install_error_strikes_its_window_only() -> None:
    inner, dest = Store(), Dest()
    out = restore(inner, FailingInstall(dest, window=2))
    assert out.failure == FailureKind.INSTALL_ERROR and "window 2" in out.detail
    assert dest.windows == [0, 1] and dest.invalidated == 1


def test_no_fault_passes_everything_through() -> None:
    inner, dest = Store(), Dest()
    out = restore(FaultyStorage(inner), FailingInstall(dest, window=-1))
    assert out.ok and out.cached_chunks == 6 and dest.windows == [0, 1, 2]
    assert inner.calls == ["probe"] + [f"{c} {j}" for j in range(3) for c in ("stage", "wait",
                                                                           "release")]  # fmt: skip


def test_fault_kinds_are_checked() -> None:
    with pytest.raises(BadInput, match="fault kind 'crash'"):
        FaultSpec("crash", window=0)
