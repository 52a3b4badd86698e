"""The failure path on a device whose copies are asynchronous (CUDA: H2D copies queued on a
stream, landing at the next sync): a window whose install failed part way is released only
after a sync confirmed the copies already issued landed, as LMCache's stock retrieve
releases from a stream callback. On CPU every copy is synchronous, so only a device that
queues copies until ``sync`` (``QueuedDevice``) can show the order."""

from __future__ import annotations

from typing import Any

from bsrkv.restore import BoundedRestorer, RestoreConfig, RestoreState, Window
from bsrkv.restore.types import FailureKind

from .fakes import FakeStorage, request


class QueuedDevice:
    """A destination whose installs queue copies that land at ``sync``, recording every
    step in one trace shared with the storage (the order is the assertion)."""

    def __init__(self, trace: list[tuple[str, int]], fail_window: int, sync_raises: bool = False):
        self.trace = trace
        self.fail_window = fail_window
        self.sync_raises = sync_raises
        self.queued: list[int] = []  # windows with copies issued, not landed
        self.window = -1

    def install(self, rid: str, w: Window, objects: Any, n: int) -> int:
        self.window = w.index
        self.queued.append(w.index)  # the first rows' copies are on the stream already
        self.trace.append(("copies-issued", w.index))
        if w.index == self.fail_window:
            raise RuntimeError("install failed after issuing copies")
        return 100 * n * len(objects)

    def sync(self, rid: str) -> None:
        if self.sync_raises and self.window == self.fail_window:
            self.trace.append(("sync-raised", self.window))
            raise RuntimeError("device error")
        for j in self.queued:
            self.trace.append(("copies-landed", j))
        self.queued.clear()

    def mark_invalid(self, rid: str) -> None:
        self.trace.append(("invalid", -1))


class TracedStorage(FakeStorage):
    def __init__(self, trace: list[tuple[str, int]]) -> None:
        super().__init__()
        self.trace = trace

    def release(self, ticket: Any) -> None:
        super().release(ticket)
        self.trace.append(("release", ticket[1].index))


def _restore(w: int, b: int, fail_window: int, sync_raises: bool = False):
    trace: list[tuple[str, int]] = []
    storage = TracedStorage(trace)
    dest = QueuedDevice(trace, fail_window, sync_raises)
    r = BoundedRestorer(storage, RestoreConfig(window_chunks=w, admission_budget_chunks=b))
    plan = r.probe(request(8))
    return r, storage, r.restore(plan, dest), trace


def test_failed_install_releases_only_after_its_copies_landed() -> None:
    _, storage, out, trace = _restore(w=2, b=2, fail_window=1)
    assert (out.state, out.failure, out.cached_chunks) == (
        RestoreState.FAILED, FailureKind.INSTALL_ERROR, 0)  # fmt: skip
    assert trace == [
        ("copies-issued", 0), ("copies-landed", 0), ("release", 0),
        ("copies-issued", 1), ("copies-landed", 1), ("release", 1), ("invalid", -1),
    ]  # fmt: skip
    assert storage.live == set()


def test_pipelined_failure_syncs_before_releasing_the_staged_next_window() -> None:
    # B = 2W: window 2 is staged while window 1 installs; both wait for window 1's copies
    r, storage, out, trace = _restore(w=2, b=4, fail_window=1)
    assert out.failure is FailureKind.INSTALL_ERROR
    landed = trace.index(("copies-landed", 1))
    assert trace[landed:] == [("copies-landed", 1), ("release", 1), ("release", 2),
                              ("invalid", -1)]  # fmt: skip
    assert storage.live == set() and not any(r.gauge.level_bytes().values())


def test_a_sync_that_raises_withholds_the_windows_instead_of_freeing_them_under_copies() -> None:
    r, storage, out, trace = _restore(w=2, b=4, fail_window=1, sync_raises=True)
    assert (out.state, out.failure) == (RestoreState.FAILED, FailureKind.INSTALL_ERROR)
    assert "release withheld: device sync after the failure raised RuntimeError('device error')" \
        in out.detail  # fmt: skip
    assert [e for e in trace if e[0] == "release"] == [("release", 0)]
    assert trace[-2:] == [("sync-raised", 1), ("invalid", -1)]
    assert storage.live == {1, 2}  # still locked: their bytes are still pinned
    # windows 1 and 2 stay accounted: per rank 2 rows x 2 chunks x 100 B each
    assert r.gauge.level_bytes() == {0: 800, 1: 800}
