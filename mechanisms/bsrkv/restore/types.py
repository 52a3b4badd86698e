"""Plain data of a bounded restore: rows, plans, windows, outcomes. No behaviour here.

A request's external state is a grid: one *row* per required (TP rank, semantic group),
one *column* per chunk of ``chunk_tokens`` tokens, in token order. Every row has the same
number of columns. A window is a range of columns; it stages every row of those columns.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class RestoreState(IntEnum):
    """How one restore ended (values kept from when it also named the steps before)."""

    COMMITTED = 3  # every window installed and released: prefix exposed as valid
    FAILED = 4  # fail-closed: every destination block invalid, nothing staged


class FailureKind(IntEnum):
    """Why a restore failed. Ordered by where in a window it happens."""

    NONE = 0  # no failure
    ADMISSION_TIMEOUT = 2  # the admission budget did not grant a window in time
    STAGE_ERROR = 3  # the storage raised while submitting a window's prefetch
    TIMEOUT = 4  # a window was not complete within window_timeout_s
    MISSING_KEY = 5  # a window finished with at least one required object absent
    READ_ERROR = 6  # staged objects could not be read back
    INSTALL_ERROR = 7  # the destination raised while installing or syncing a window
    RELEASE_ERROR = 8  # the storage raised while releasing a window's staging
    DEADLINE = 9  # the whole retrieve outran retrieve_deadline_s (kept below the caller's
    # own timeout, so nothing is installed after the engine gave up and recomputed)
    READBACK_MISMATCH = 10  # an installed slice read back differs from the staged bytes
    # (or the read-back raised): the window is not trusted, the prefix is recomputed


class EventKind(IntEnum):
    """Steps of a restore, recorded in order so tests can compare whole traces."""

    ADMIT = 0  # admission budget granted for one window
    STAGE = 1  # prefetch submitted for one window
    READY = 2  # window complete in the staging pool
    INSTALL = 3  # window copied into its destination slice and synced
    RELEASE = 4  # window's staging released, budget returned
    COMMIT = 5  # whole prefix exposed
    FAIL = 6  # restore failed; destination invalidated
    READBACK = 7  # window read back from its destination; every digest equal


@dataclass(frozen=True, order=True)
class RowId:
    """One required (TP rank, semantic group) of the registration."""

    rank: int  # TP rank (kv rank index 0..tp_size-1), not LMCache's packed kv_rank
    group: int  # semantic (HMA / object) group index


@dataclass(frozen=True)
class RowKeys(Generic[K]):
    """The storage keys of one row, chunk-ordered: keys[i] covers chunk i."""

    row: RowId  # which (rank, group) this row is
    keys: tuple[K, ...]  # one opaque storage key per chunk
    chunk_bytes: int  # bytes of one object of this row (from the registration)


@dataclass(frozen=True)
class RestoreRequest(Generic[K]):
    """What the caller wants restored: every required row of one request."""

    request_id: str  # caller's request id (also the force-local marker key)
    rows: tuple[RowKeys[K], ...]  # every required (rank, group); all of equal length
    chunk_tokens: int  # tokens per chunk

    @property
    def num_chunks(self) -> int:
        return len(self.rows[0].keys) if self.rows else 0

    @property
    def row_ids(self) -> tuple[RowId, ...]:
        return tuple(r.row for r in self.rows)

    def column_bytes_by_rank(self) -> dict[int, int]:
        """Bytes one chunk (column) stages per rank: c per rank."""
        out: dict[int, int] = {}
        for r in self.rows:
            out[r.row.rank] = out.get(r.row.rank, 0) + r.chunk_bytes
        return out


@dataclass(frozen=True)
class RestorePlan(Generic[K]):
    """The confirmed plan: decided from a probe before any byte is staged."""

    request: RestoreRequest[K]  # the request probed
    prefix_chunks: int  # complete advertised prefix: every required row hits chunks < this
    collapsed_rows: tuple[RowId, ...]  # rows that were invalid (missing/forced) -> prefix 0
    forced_local: bool  # a force-local marker was set: prefix reported as 0


@dataclass(frozen=True)
class Window:
    """One window of the plan: columns [chunk_start, chunk_stop) of every row."""

    index: int  # 0-based window number j
    chunk_start: int  # first chunk (inclusive)
    chunk_stop: int  # last chunk (exclusive)

    @property
    def num_chunks(self) -> int:
        return self.chunk_stop - self.chunk_start


@dataclass(frozen=True)
class StageResult:
    """What the storage reports when a staged window finishes."""

    hits: tuple[tuple[bool, ...], ...]  # per row (request order), per window chunk: resident+locked
    staged_bytes_by_rank: dict[int, int]  # bytes actually resident for this window, per rank

    @property
    def complete(self) -> bool:
        return all(all(row) for row in self.hits)

    def prefix_chunks(self) -> int:
        """Columns from the window start where every row hit (stock whole-plan semantics)."""
        n = len(self.hits[0]) if self.hits else 0
        for i in range(n):
            if not all(row[i] for row in self.hits):
                return i
        return n


@dataclass(frozen=True)
class RestoreEvent:
    """One step of a restore trace."""

    kind: EventKind  # which step
    window: int  # window index, -1 for request-level events
    chunk_start: int  # first chunk of the window (or of the prefix)
    chunk_stop: int  # end chunk of the window (or of the prefix)


@dataclass(frozen=True)
class WindowTiming:
    """Where one window's time went, on the restorer's clock (seconds from restore start).

    Always recorded (a few clock reads per window). ``fetch`` is ``ready_at - staged_at``:
    how long the tier took to make the window complete; ``wait_s`` the part of it the
    restore sat blocked (what pipelining did not hide).
    """

    index: int  # window j
    admit_wait_s: float  # blocked on the admission budget before staging
    staged_at_s: float  # stage (locked prefetch) submitted
    ready_at_s: float  # wait returned: window complete in the staging pool
    installed_at_s: float  # install and sync done (the window is in its destination)
    released_at_s: float  # staging released, budget returned (-1: not released)
    wait_s: float  # blocked in the storage's wait
    install_s: float  # destination.install (issuing the copies)
    sync_s: float  # destination.sync (copies landed)
    readback_s: float | None = None  # install read-back (None: not read back)

    @property
    def fetch_s(self) -> float:
        return self.ready_at_s - self.staged_at_s

    def to_json(self) -> dict[str, float]:
        return {
            "index": self.index,
            "admit_wait_s": round(self.admit_wait_s, 6),
            "fetch_s": round(self.fetch_s, 6),
            "wait_s": round(self.wait_s, 6),
            "install_s": round(self.install_s, 6),
            "sync_s": round(self.sync_s, 6),
            "installed_at_s": round(self.installed_at_s, 6),
        } | ({} if self.readback_s is None else {"readback_s": round(self.readback_s, 6)})


@dataclass(frozen=True)
class ReadbackSummary:
    """One restore's read-back totals (``RestoreOutcome.readback``; None when not run)."""

    windows_checked: int  # windows read back (== windows installed when nothing failed)
    chunks_checked: int
    chunks_unchecked: int
    mismatches: int  # objects whose read-back digest differed
    seconds: float  # restorer-clock time spent reading back
    scratch_bytes: int  # the largest scratch held (not in the restore pool / L1)

    def to_json(self) -> dict[str, Any]:
        return {
            "windows_checked": self.windows_checked,
            "chunks_checked": self.chunks_checked,
            "chunks_unchecked": self.chunks_unchecked,
            "mismatches": self.mismatches,
            "seconds": round(self.seconds, 6),
            "scratch_bytes": self.scratch_bytes,
        }


@dataclass(frozen=True)
class RestoreOutcome:
    """The decision a restore ends in. ok=False always means cached_chunks == 0."""

    request_id: str  # request restored
    state: RestoreState  # COMMITTED or FAILED
    failure: FailureKind  # NONE when committed
    detail: str  # human-readable cause with numbers ("" when committed)
    cached_chunks: int  # chunks exposed as computed (0 on failure)
    chunk_tokens: int  # tokens per chunk
    bytes_restored: int  # bytes installed into the destination (counted even on failure)
    windows_done: int  # windows installed and released before commit/failure
    window_chunks: int  # W used (0 = whole plan)
    budget_chunks: int  # B used (0 = none, whole plan)
    peak_staged_bytes_by_rank: dict[int, int]  # this restore's own staging high-water mark
    events: tuple[RestoreEvent, ...] = field(default=(), repr=False)  # ordered trace
    # Per installed window, in window order; timings are not part of equality (traces are).
    timings: tuple[WindowTiming, ...] = field(default=(), repr=False, compare=False)
    # Install read-back totals (None: not read back); not part of equality (times vary).
    readback: ReadbackSummary | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.state == RestoreState.COMMITTED

    @property
    def cached_tokens(self) -> int:
        return self.cached_chunks * self.chunk_tokens

    @property
    def first_install_s(self) -> float | None:
        """Restore start to the first window installed (None: none was)."""
        return self.timings[0].installed_at_s if self.timings else None
