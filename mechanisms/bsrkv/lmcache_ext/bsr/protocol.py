"""The ``bsr.*`` wire: the replies of the server module's methods and the one structured
request (``bsr.configure``'s), one typed definition for both sides.

The server's handlers build these and send ``to_json()`` (``json.dumps(..., sort_keys=True)``);
a client reads them back with ``from_json()``, which raises ``ProtocolError`` on a missing,
unexpected or mistyped key, so a measure renamed on one side fails loudly instead of
reading as absent. Pure: no lmcache or torch import, usable wherever the client runs.

Each reply is a frozen ``bsrkv.strictjson`` record (msgspec): its fields' types are its
reader and writer. Rank-keyed maps are ``dict[int, int]`` here, string-keyed on the wire.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from bsrkv.control_token import REFUSED
from bsrkv.lmcache_ext.bsr.protocol_base import ByRank, ProtocolError, Reply

SCHEMA = "bsrkv.lmcache_ext/1"

# ---- bsr.peak / bsr.reset_peak ----------------------------------------------------------


class PeakReply(Reply):
    """``bsr.peak``: the restore pool gauge (per TP rank) and L1's measured occupancy."""

    WHAT: ClassVar[str] = "bsr.peak"

    restore_pool_peak_bytes_by_rank: ByRank  # high-water mark
    restore_pool_peak_bytes: int  # max over ranks
    restore_pool_level_bytes_by_rank: ByRank  # level now
    l1_used_peak_bytes: int  # L1 usage sampled whenever a window was staged
    l1_used_bytes: int  # L1 usage now
    l1_capacity_bytes: int


class ResetPeakReply(Reply):
    """``bsr.reset_peak``: the peak before, and the new period's start (the current level)."""

    WHAT: ClassVar[str] = "bsr.reset_peak"

    before: PeakReply
    after: PeakReply


# ---- restore outcomes (bsr.status's recent_outcomes) ------------------------------------


class ReadbackTotals(Reply):
    """One retrieve's install read-back (the core's ``ReadbackSummary.to_json()``)."""

    WHAT: ClassVar[str] = "restore outcome readback"

    windows_checked: int
    chunks_checked: int
    chunks_unchecked: int  # skipped by the install (APC-shared blocks)
    mismatches: int
    seconds: float
    scratch_bytes: int  # outside L1 and the restore pool's gauge


class RestoreOutcomeSummary(Reply, frozen=True, omit_defaults=True):
    """One retrieve of one rank. A stock (W = 0) retrieve has only the first seven fields
    (on the wire too); a BSR one also the restore core's outcome."""

    WHAT: ClassVar[str] = "restore outcome"
    BSR_ONLY: ClassVar[frozenset[str]] = frozenset(
        {"failure", "detail", "cached_chunks", "windows_done", "bytes_restored"}
        | {"peak_staged_bytes_by_rank"}
    )
    OPTIONAL: ClassVar[frozenset[str]] = BSR_ONLY | {"window_phases", "readback", "retrieve_s"}

    request_id: str
    rank: int | None  # the worker's TP rank
    mode: str  # "bsr" | "stock"
    ok: bool
    start_token: int
    end_token: int
    # from the lookup of the prefix to the last byte installed, alike for both modes (the
    # whole plan fetches in its lookup, BSR in its windows); the retrieve alone when this
    # server did not see the lookup
    restore_s: float
    failure: str | None = None  # FailureKind name ("NONE" when ok)
    detail: str | None = None  # why it failed ("" when ok)
    cached_chunks: int | None = None  # 0 on failure
    windows_done: int | None = None
    bytes_restored: int | None = None
    # int keys on the wire as in the core's outcome (json.dumps sorts them as numbers)
    peak_staged_bytes_by_rank: ByRank | None = None
    # per installed window (core's WindowTiming.to_json): index, admit_wait_s, fetch_s,
    # wait_s, install_s, sync_s, installed_at_s; absent on the wire when not recorded
    window_phases: tuple[dict[str, float], ...] | None = None
    readback: ReadbackTotals | None = None  # None: off
    retrieve_s: float | None = None  # the retrieve call alone

    def __post_init__(self) -> None:
        if self.mode not in ("bsr", "stock"):
            raise ProtocolError(f"{self.WHAT}: mode {self.mode!r}, expected bsr or stock")
        present = {k for k in self.BSR_ONLY if getattr(self, k) is not None}
        if present != (self.BSR_ONLY if self.mode == "bsr" else frozenset()):
            raise ProtocolError(
                f"{self.WHAT} ({self.mode}): {sorted(self.BSR_ONLY)} are all present for "
                f"mode bsr and all absent for mode stock; present: {sorted(present)}"
            )


# ---- bsr.status -------------------------------------------------------------------------


class LastProbe(Reply):
    """The last probe-only lookup that completed (``{}`` on the wire before any)."""

    WHAT: ClassVar[str] = "bsr.status.last_probe"

    request_id: str
    model_name: str
    world_size: int
    end_token: int
    chunks: int  # complete advertised prefix


class GuardFailure(Reply):
    """Failures of one site of a guard in the server process (``bsrkv.hostguard``), by
    exception type: cumulative since the process started."""

    WHAT: ClassVar[str] = "bsr.status guard failure"

    guard: str  # the guard's name: the module whose part degraded to stock
    site: str
    type: str  # the exception's class name
    count: int


class StatusReply(Reply):
    """``bsr.status`` (also under ``"bsr"`` in the server's HTTP ``/status``).
    ``guard_failures``: every guard's failures in the server process (None: a module that
    does not report them, which a reader must take as not read, never as none)."""

    WHAT: ClassVar[str] = "bsr.status"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"guard_failures"})

    config: dict[str, Any]  # the module's config (ServerModuleConfig's fields)
    effective_window_chunks: int  # W in effect (0 when degraded)
    effective_budget_chunks: int  # B in effect (0 for W = 0)
    budget_in_use_chunks: int
    budget_peak_in_use_chunks: int
    degraded: str  # why the module runs W = 0 against its config ("" if not)
    counters: dict[str, int]  # lookups, retrieves_ok, failures_<kind>, ...
    force_local_markers: int  # markers active now
    force_local_events: dict[str, int]  # set / forced_lookup / cleared_*
    l1_used_after_last_probe_bytes: int  # -1 before any probe
    last_probe: LastProbe | None  # {} on the wire before any probe
    tracked_requests: int
    peak: PeakReply
    recent_outcomes: tuple[RestoreOutcomeSummary, ...]
    schema: str = SCHEMA  # required on the wire all the same
    guard_failures: tuple[GuardFailure, ...] | None = None

    def __post_init__(self) -> None:
        if self.schema != SCHEMA:
            raise ProtocolError(
                f"{self.WHAT}.schema: {self.schema!r}, this client reads {SCHEMA!r}"
            )

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        return {**out, "last_probe": out["last_probe"] or {}}

    @classmethod
    def from_json(cls, raw: Any) -> Self:
        if isinstance(raw, dict) and raw.get("last_probe") == {}:
            raw = {**raw, "last_probe": None}
        return super().from_json(raw)

    def counter(self, name: str) -> int:
        """A counter's value (a counter appears at its first event: absent means 0)."""
        return self.counters.get(name, 0)


# ---- bsr.registration ------------------------------------------------------------------


class LiveTensor(Reply):
    """One KV tensor the engine registered (REGISTER_KV_CACHE), seen per chunk on its rank."""

    WHAT: ClassVar[str] = "bsr.registration tensor"

    index: int  # registration order (the engine's layer order); names are not sent
    shape: tuple[int, ...]  # per chunk: (2, T, heads, head_dim) K/V; (T, w) latent
    dtype: str  # torch dtype name without "torch."
    group: int  # LMCache object group the tensor's chunks are stored in
    registered_shape: tuple[int, ...]  # the whole tensor as registered


class LiveGroup(Reply):
    """One LMCache object group of a registration (one storage object per chunk and rank)."""

    WHAT: ClassVar[str] = "bsr.registration group"

    index: int
    kind: str  # attention | recurrent | aux
    sliding_window_chunks: int  # -1 full attention
    engine_group_ids: tuple[int, ...]  # the engine's KV cache groups (EngineGroupInfo)


class LiveEngineGroup(Reply):
    """One of the engine's KV cache groups as REGISTER_KV_CACHE's ``EngineGroupInfo`` gave it
    (one entry per LMCache kernel group: layers of one engine group sharing a copy kernel)."""

    WHAT: ClassVar[str] = "bsr.registration engine group"

    engine_group_id: int
    layer_indices: tuple[int, ...]
    tokens_per_block: int  # 0: the engine did not say
    sw_size_tokens: int  # -1: not sliding-window attention
    engine_kv_format: str  # LMCache's name of the tensors' layout


class LiveRegistration(Reply):
    """What one engine instance (one TP rank's worker) registered with this server."""

    WHAT: ClassVar[str] = "bsr.registration entry"

    instance_id: int
    model_name: str
    world_size: int
    chunk_tokens: int
    num_blocks: int
    groups: tuple[LiveGroup, ...]
    engine_groups: tuple[LiveEngineGroup, ...]
    tensors: tuple[LiveTensor, ...]


class RegistrationReply(Reply):
    """``bsr.registration``: every live KV cache registration, by instance id."""

    WHAT: ClassVar[str] = "bsr.registration"

    registrations: tuple[LiveRegistration, ...]


# ---- bsr.markers ------------------------------------------------------------------------


class MarkerEvent(Reply):
    WHAT: ClassVar[str] = "bsr.markers event"

    request_id: str
    event: str  # set | forced_lookup | cleared_admitted | cleared_teardown
    reason: str  # the failure that set the marker ("" for the other events)
    t: float  # wall-clock time (time.time())


class MarkersReply(Reply):
    """``bsr.markers``: active force-local markers and their bounded history."""

    WHAT: ClassVar[str] = "bsr.markers"

    active: int
    counts: dict[str, int]  # events by kind since start
    events: tuple[MarkerEvent, ...]


# ---- bsr.forget / bsr.configure ---------------------------------------------------------


class ForgetReply(Reply):
    """``bsr.forget``: L1 usage before and after the clear."""

    WHAT: ClassVar[str] = "bsr.forget"

    l1_used_bytes_before: int
    l1_used_bytes_after: int
    force: bool  # locked objects were dropped too
    waited_s: float


class ConfigureRequest(Reply, frozen=True, omit_defaults=True):
    """``bsr.configure``'s request: the settings a run changes between requests, each
    absent (None) when unchanged. The server reads it with ``from_json`` (an unknown or
    mistyped key is refused, naming it), then validates the merged config (B >= W, bounds).
    The other settings (load concurrency, checksums, O_DIRECT) are the adapters', fixed
    when LMCache loaded them."""

    WHAT: ClassVar[str] = "bsr.configure request"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"window_chunks", "admission_budget_chunks", "readback", "window_staging"}
        | {"window_timeout_s", "probe_timeout_s", "admission_timeout_s"}
        | {"retrieve_deadline_s", "drain_timeout_s", "stall_guard_s"}
        | {"test_only_fail_install_window"}
    )

    window_chunks: int | None = None  # W; 0 = the stock whole-plan path
    admission_budget_chunks: int | None = None  # B; 0 means B = W
    readback: bool | None = None
    window_staging: Literal["direct", "prefetch"] | None = None
    window_timeout_s: float | None = None
    probe_timeout_s: float | None = None
    admission_timeout_s: float | None = None
    retrieve_deadline_s: float | None = None
    drain_timeout_s: float | None = None
    stall_guard_s: float | None = None
    test_only_fail_install_window: int | None = None  # TEST ONLY (the server's config)

    def changes(self) -> dict[str, Any]:
        """The settings this request changes (its keys on the wire)."""
        return self.to_json()


class ConfigureReply(Reply, frozen=True, omit_defaults=True):
    """``bsr.configure``: the config in effect after the call; ``error`` iff refused."""

    WHAT: ClassVar[str] = "bsr.configure"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"error"})

    ok: bool
    config: dict[str, Any]
    error: str | None = None

    def __post_init__(self) -> None:
        if self.ok != (self.error is None):
            raise ProtocolError(f"{self.WHAT}: error is set exactly when ok is false")


class HoldsReply(Reply):
    """``bsr.holds``: the prompt's leading whole chunks each L2 adapter holds (a real
    lookup-and-lock, then unlock), in the storage manager's adapter order; ``error`` why
    none could be looked up."""

    WHAT: ClassVar[str] = "bsr.holds"

    chunks: int  # whole chunks of the prompt
    held_chunks_by_adapter: tuple[int, ...]
    error: str


# ---- a mutating method refused (bsrkv.control_token) ------------------------------------


class RefusedReply(Reply):
    """Any mutating method called without the server's control token (or with a wrong one):
    nothing was changed. ``refused`` is always ``"control token"``."""

    WHAT: ClassVar[str] = "refused"

    ok: bool  # always false (a generic reader sees a failure)
    method: str
    refused: str
    error: str  # names the method and what is wrong with the token

    def __post_init__(self) -> None:
        if self.ok or self.refused != REFUSED:
            raise ProtocolError(f"{self.WHAT}: ok is false and refused is {REFUSED!r}")

    @classmethod
    def of(cls, method: str, error: str) -> RefusedReply:
        return cls(False, method, REFUSED, error)

    @staticmethod
    def is_refusal(raw: Any) -> bool:
        """Whether a reply is a refusal (read it with ``from_json``)."""
        return isinstance(raw, dict) and raw.get("refused") == REFUSED


FAILED = "handler"  # a failure's ``failed`` value


class FailedReply(Reply):
    """Any ``bsr.*`` / ``tempokv.*`` method that raised inside the server (counted on the
    module's guard, ``bsrkv.hostguard``): the server went on; what the method would have
    answered is not known. ``failed`` is always ``"handler"``."""

    WHAT: ClassVar[str] = "failed"

    ok: bool  # always false
    method: str
    failed: str
    error: str  # the exception, type and message

    def __post_init__(self) -> None:
        if self.ok or self.failed != FAILED:
            raise ProtocolError(f"{self.WHAT}: ok is false and failed is {FAILED!r}")

    @classmethod
    def of(cls, method: str, exc: BaseException) -> FailedReply:
        return cls(False, method, FAILED, f"{type(exc).__name__}: {exc}")

    @staticmethod
    def is_failure(raw: Any) -> bool:
        return isinstance(raw, dict) and raw.get("failed") == FAILED


__all__ = [
    "FailedReply",
    "SCHEMA",
    "ConfigureReply",
    "ForgetReply",
    "HoldsReply",
    "LastProbe",
    "MarkerEvent",
    "MarkersReply",
    "PeakReply",
    "ProtocolError",
    "ReadbackTotals",
    "RefusedReply",
    "Reply",
    "ResetPeakReply",
    "RestoreOutcomeSummary",
    "StatusReply",
]
