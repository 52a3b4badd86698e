"""Faults of a storage-stack restore, placed from outside the restore path.

The stack's ``restore()`` knows no fault: ``restore_with_fault`` builds the same restore job
(``StorageStack.job``), puts its storage and destination behind the wrappers here, and runs
it (``StorageStack.run``). The failure matrix's storage cells and the property tests place
their faults this way; every other caller gets the stock path.

- ``drop_key``: once the probe has seen the whole prefix, one object of window k (the
  fault's rank and group) is deleted from L2 and L1: a real missing key at staging.
- ``timeout``: window k's wait reports a timeout at once (its prefetch still runs and is
  drained by the release, as a late one is).
- ``install_error``: the destination raises while installing window k.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from bsrctl.errors import BadInput
from bsrkv.restore import (
    RestoreDestination,
    RestoreRequest,
    RestoreStorage,
    RowId,
    StageResult,
    Window,
)

if TYPE_CHECKING:
    from bsrctl.stack.storage.config import StorageRestoreResult
    from bsrctl.stack.storage.stack import RestoreJob, StorageStack

FAULT_KINDS = ("drop_key", "timeout", "install_error")


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault of a restore."""

    kind: str  # "drop_key" | "timeout" | "install_error"
    window: int  # window index j where it strikes
    rank: int = 0  # rank whose object is dropped (drop_key)
    group: int = 0  # group whose object is dropped (drop_key)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise BadInput(f"fault kind {self.kind!r}: one of {FAULT_KINDS}")


class InjectedInstallError(RuntimeError):
    """Raised by a destination at the window a FaultSpec names."""


@dataclass(frozen=True)
class _Ticket:
    window: Window
    inner: Any  # the wrapped storage's ticket


class FaultyStorage:
    """A RestoreStorage that passes everything through, but for one fault: ``after_probe``
    runs once the probe returned (drop_key), window ``timeout_window`` times out."""

    def __init__(
        self,
        inner: RestoreStorage,
        timeout_window: int = -1,
        after_probe: Callable[[], None] | None = None,
    ) -> None:
        self.inner = inner
        self.timeout_window = timeout_window
        self.after_probe = after_probe

    def probe(self, request: RestoreRequest[Any]) -> Sequence[Sequence[bool]]:
        hits = self.inner.probe(request)
        if self.after_probe is not None:
            self.after_probe()
        return hits

    def stage(self, request: RestoreRequest[Any], window: Window) -> _Ticket:
        return _Ticket(window, self.inner.stage(request, window))

    def wait(self, ticket: _Ticket, timeout_s: float) -> StageResult | None:
        if ticket.window.index == self.timeout_window:
            return None
        return self.inner.wait(ticket.inner, timeout_s)

    @contextmanager
    def read(self, ticket: _Ticket, num_chunks: int) -> Iterator[Mapping[RowId, Sequence[Any]]]:
        with self.inner.read(ticket.inner, num_chunks) as objs:
            yield objs

    def release(self, ticket: _Ticket) -> None:
        self.inner.release(ticket.inner)


class FailingInstall:
    """A RestoreDestination that raises InjectedInstallError installing window ``window``."""

    def __init__(self, inner: RestoreDestination, window: int) -> None:
        self.inner = inner
        self.window = window

    def install(
        self,
        request_id: str,
        window: Window,
        objects: Mapping[RowId, Sequence[Any]],
        num_chunks: int,
    ) -> int:
        if window.index == self.window:
            raise InjectedInstallError(f"injected install error in window {window.index}")
        return self.inner.install(request_id, window, objects, num_chunks)

    def sync(self, request_id: str) -> None:
        self.inner.sync(request_id)

    def mark_invalid(self, request_id: str) -> None:
        self.inner.mark_invalid(request_id)


def inject(stack: StorageStack, job: RestoreJob, fault: FaultSpec) -> RestoreJob:
    """The job with ``fault`` placed in its storage or its destination."""
    if fault.kind == "install_error":
        return replace(job, destination=FailingInstall(job.destination, fault.window))
    if fault.kind == "timeout":
        return replace(job, storage=FaultyStorage(job.storage, timeout_window=fault.window))
    prefix = job.request.num_chunks
    w = job.config.window_chunks or prefix
    chunk = fault.window * w
    if chunk >= prefix:
        raise BadInput(f"fault window {fault.window} is beyond the plan ({prefix} chunks, W={w})")
    seeded = stack.seeded
    assert seeded is not None  # a job exists only for a seeded prefix
    key = stack.key_of(seeded.hashes[chunk], fault.rank, fault.group)
    return replace(
        job, storage=FaultyStorage(job.storage, after_probe=lambda: stack.drop(key, fault.rank))
    )


def restore_with_fault(
    stack: StorageStack,
    fault: FaultSpec,
    window_chunks: int,
    budget_chunks: int = 0,
    *,
    pipeline: bool = True,
    request_id: str = "",
) -> StorageRestoreResult:
    """``stack.restore(window_chunks, budget_chunks)`` with ``fault`` placed in it."""
    job = stack.job(window_chunks, budget_chunks, pipeline=pipeline, request_id=request_id)
    return stack.run(inject(stack, job, fault))
