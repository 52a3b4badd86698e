"""The replies of the server module's ``bsr.*`` methods: one typed definition for both sides.

The server's handlers build these and send ``to_json()`` (``json.dumps(..., sort_keys=True)``);
a client reads them back with ``from_json()``, which raises ``ProtocolError`` on a missing,
unexpected or mistyped key, so a measure renamed on one side fails loudly instead of
reading as absent. Pure: no lmcache or torch import, usable wherever the client runs.

Each field names its JSON reader (and, where the wire differs from the value, its writer)
in its metadata. Rank-keyed maps are ``dict[int, int]`` here, string-keyed on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from bsrkv.control_token import REFUSED
from bsrkv.lmcache_ext.protocol_base import (  # noqa: F401 - the readers, and re-exported
    ProtocolError,
    Reply,
    _bool,
    _by_rank,
    _counts,
    _f,
    _float,
    _int,
    _list_of,
    _obj,
    _opt_float,
    _opt_int,
    _phases,
    _plain,
    _ranked,
    _reply,
    _str,
)

SCHEMA = "bsrkv.lmcache_ext/1"

# ---- bsr.peak / bsr.reset_peak ----------------------------------------------------------


@dataclass(frozen=True)
class PeakReply(Reply):
    """``bsr.peak``: the restore pool gauge (per TP rank) and L1's measured occupancy."""

    WHAT: ClassVar[str] = "bsr.peak"

    restore_pool_peak_bytes_by_rank: dict[int, int] = _f(_by_rank, _ranked)  # high-water mark
    restore_pool_peak_bytes: int = _f(_int)  # max over ranks
    restore_pool_level_bytes_by_rank: dict[int, int] = _f(_by_rank, _ranked)  # level now
    l1_used_peak_bytes: int = _f(_int)  # L1 usage sampled whenever a window was staged
    l1_used_bytes: int = _f(_int)  # L1 usage now
    l1_capacity_bytes: int = _f(_int)


@dataclass(frozen=True)
class ResetPeakReply(Reply):
    """``bsr.reset_peak``: the peak before, and the new period's start (the current level)."""

    WHAT: ClassVar[str] = "bsr.reset_peak"

    before: PeakReply = _f(_reply(PeakReply))
    after: PeakReply = _f(_reply(PeakReply))


# ---- restore outcomes (bsr.status's recent_outcomes) ------------------------------------


@dataclass(frozen=True)
class ReadbackTotals(Reply):
    """One retrieve's install read-back (the core's ``ReadbackSummary.to_json()``)."""

    WHAT: ClassVar[str] = "restore outcome readback"

    windows_checked: int = _f(_int)
    chunks_checked: int = _f(_int)
    chunks_unchecked: int = _f(_int)  # skipped by the install (APC-shared blocks)
    mismatches: int = _f(_int)
    seconds: float = _f(_float)
    scratch_bytes: int = _f(_int)  # outside L1 and the restore pool's gauge


@dataclass(frozen=True)
class RestoreOutcomeSummary(Reply):
    """One retrieve of one rank. A stock (W = 0) retrieve has only the first seven fields
    (on the wire too); a BSR one also the restore core's outcome."""

    WHAT: ClassVar[str] = "restore outcome"
    BSR_ONLY: ClassVar[frozenset[str]] = frozenset(
        {"failure", "detail", "cached_chunks", "windows_done", "bytes_restored"}
        | {"peak_staged_bytes_by_rank"}
    )
    OPTIONAL: ClassVar[frozenset[str]] = BSR_ONLY | {"window_phases", "readback", "retrieve_s"}

    request_id: str = _f(_str)
    rank: int | None = _f(_opt_int)  # the worker's TP rank
    mode: str = _f(_str)  # "bsr" | "stock"
    ok: bool = _f(_bool)
    start_token: int = _f(_int)
    end_token: int = _f(_int)
    # from the lookup of the prefix to the last byte installed, alike for both modes (the
    # whole plan fetches in its lookup, BSR in its windows); the retrieve alone when this
    # server did not see the lookup
    restore_s: float = _f(_float)
    failure: str | None = _f(_str, default=None)  # FailureKind name ("NONE" when ok)
    detail: str | None = _f(_str, default=None)  # why it failed ("" when ok)
    cached_chunks: int | None = _f(_int, default=None)  # 0 on failure
    windows_done: int | None = _f(_int, default=None)
    bytes_restored: int | None = _f(_int, default=None)
    # int keys on the wire as in the core's outcome (json.dumps sorts them as numbers)
    peak_staged_bytes_by_rank: dict[int, int] | None = _f(_by_rank, default=None)
    # per installed window (core's WindowTiming.to_json): index, admit_wait_s, fetch_s,
    # wait_s, install_s, sync_s, installed_at_s; absent on the wire when not recorded
    window_phases: tuple[dict[str, float], ...] | None = _f(_phases, default=None)
    readback: ReadbackTotals | None = _f(_reply(ReadbackTotals), default=None)  # None: off
    retrieve_s: float | None = _f(_opt_float, default=None)  # the retrieve call alone

    def __post_init__(self) -> None:
        if self.mode not in ("bsr", "stock"):
            raise ProtocolError(f"{self.WHAT}: mode {self.mode!r}, expected bsr or stock")
        present = {k for k in self.BSR_ONLY if getattr(self, k) is not None}
        if present != (self.BSR_ONLY if self.mode == "bsr" else frozenset()):
            raise ProtocolError(
                f"{self.WHAT} ({self.mode}): {sorted(self.BSR_ONLY)} are all present for "
                f"mode bsr and all absent for mode stock; present: {sorted(present)}"
            )

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        for name in ("window_phases", "readback", "retrieve_s"):
            if getattr(self, name) is None:
                del out[name]
        return {k: v for k, v in out.items() if k not in self.BSR_ONLY or self.mode == "bsr"}


# ---- bsr.status -------------------------------------------------------------------------


@dataclass(frozen=True)
class LastProbe(Reply):
    """The last probe-only lookup that completed (``{}`` on the wire before any)."""

    WHAT: ClassVar[str] = "bsr.status.last_probe"

    request_id: str = _f(_str)
    model_name: str = _f(_str)
    world_size: int = _f(_int)
    end_token: int = _f(_int)
    chunks: int = _f(_int)  # complete advertised prefix


def _last_probe(v: Any, _w: str) -> LastProbe | None:
    return None if v == {} else LastProbe.from_json(v)


def _schema(v: Any, w: str) -> str:
    if v != SCHEMA:
        raise ProtocolError(f"{w}: {v!r}, this client reads {SCHEMA!r}")
    return v


@dataclass(frozen=True)
class StatusReply(Reply):
    """``bsr.status`` (also under ``"bsr"`` in the server's HTTP ``/status``)."""

    WHAT: ClassVar[str] = "bsr.status"

    config: dict[str, Any] = _f(_obj)  # the module's config (ServerModuleConfig's fields)
    effective_window_chunks: int = _f(_int)  # W in effect (0 when degraded)
    effective_budget_chunks: int = _f(_int)  # B in effect (0 for W = 0)
    budget_in_use_chunks: int = _f(_int)
    budget_peak_in_use_chunks: int = _f(_int)
    degraded: str = _f(_str)  # why the module runs W = 0 against its config ("" if not)
    counters: dict[str, int] = _f(_counts)  # lookups, retrieves_ok, failures_<kind>, ...
    force_local_markers: int = _f(_int)  # markers active now
    force_local_events: dict[str, int] = _f(_counts)  # set / forced_lookup / cleared_*
    l1_used_after_last_probe_bytes: int = _f(_int)  # -1 before any probe
    last_probe: LastProbe | None = _f(_last_probe, lambda p: p.to_json() if p else {})
    tracked_requests: int = _f(_int)
    peak: PeakReply = _f(_reply(PeakReply))
    recent_outcomes: tuple[RestoreOutcomeSummary, ...] = _f(
        _list_of(RestoreOutcomeSummary.from_json)
    )
    schema: str = _f(_schema, default=SCHEMA)

    def counter(self, name: str) -> int:
        """A counter's value (a counter appears at its first event: absent means 0)."""
        return self.counters.get(name, 0)


# ---- bsr.registration ------------------------------------------------------------------


def _ints(v: Any, w: str) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise ProtocolError(f"{w}: expected a list of integers, got {v!r}")
    return tuple(_int(x, f"{w}[{i}]") for i, x in enumerate(v))


@dataclass(frozen=True)
class LiveTensor(Reply):
    """One KV tensor the engine registered (REGISTER_KV_CACHE), seen per chunk on its rank."""

    WHAT: ClassVar[str] = "bsr.registration tensor"

    index: int = _f(_int)  # registration order (the engine's layer order); names are not sent
    shape: tuple[int, ...] = _f(_ints)  # per chunk: (2, T, heads, head_dim) K/V; (T, w) latent
    dtype: str = _f(_str)  # torch dtype name without "torch."
    group: int = _f(_int)  # LMCache object group the tensor's chunks are stored in
    registered_shape: tuple[int, ...] = _f(_ints)  # the whole tensor as registered


@dataclass(frozen=True)
class LiveGroup(Reply):
    """One LMCache object group of a registration (one storage object per chunk and rank)."""

    WHAT: ClassVar[str] = "bsr.registration group"

    index: int = _f(_int)
    kind: str = _f(_str)  # attention | recurrent | aux
    sliding_window_chunks: int = _f(_int)  # -1 full attention
    engine_group_ids: tuple[int, ...] = _f(_ints)  # the engine's KV cache groups (EngineGroupInfo)


@dataclass(frozen=True)
class LiveEngineGroup(Reply):
    """One of the engine's KV cache groups as REGISTER_KV_CACHE's ``EngineGroupInfo`` gave it
    (one entry per LMCache kernel group: layers of one engine group sharing a copy kernel)."""

    WHAT: ClassVar[str] = "bsr.registration engine group"

    engine_group_id: int = _f(_int)
    layer_indices: tuple[int, ...] = _f(_ints)
    tokens_per_block: int = _f(_int)  # 0: the engine did not say
    sw_size_tokens: int = _f(_int)  # -1: not sliding-window attention
    engine_kv_format: str = _f(_str)  # LMCache's name of the tensors' layout


@dataclass(frozen=True)
class LiveRegistration(Reply):
    """What one engine instance (one TP rank's worker) registered with this server."""

    WHAT: ClassVar[str] = "bsr.registration entry"

    instance_id: int = _f(_int)
    model_name: str = _f(_str)
    world_size: int = _f(_int)
    chunk_tokens: int = _f(_int)
    num_blocks: int = _f(_int)
    groups: tuple[LiveGroup, ...] = _f(_list_of(LiveGroup.from_json))
    engine_groups: tuple[LiveEngineGroup, ...] = _f(_list_of(LiveEngineGroup.from_json))
    tensors: tuple[LiveTensor, ...] = _f(_list_of(LiveTensor.from_json))


@dataclass(frozen=True)
class RegistrationReply(Reply):
    """``bsr.registration``: every live KV cache registration, by instance id."""

    WHAT: ClassVar[str] = "bsr.registration"

    registrations: tuple[LiveRegistration, ...] = _f(_list_of(LiveRegistration.from_json))


# ---- bsr.markers ------------------------------------------------------------------------


@dataclass(frozen=True)
class MarkerEvent(Reply):
    WHAT: ClassVar[str] = "bsr.markers event"

    request_id: str = _f(_str)
    event: str = _f(_str)  # set | forced_lookup | cleared_admitted | cleared_teardown
    reason: str = _f(_str)  # the failure that set the marker ("" for the other events)
    t: float = _f(_float)  # wall-clock time (time.time())


@dataclass(frozen=True)
class MarkersReply(Reply):
    """``bsr.markers``: active force-local markers and their bounded history."""

    WHAT: ClassVar[str] = "bsr.markers"

    active: int = _f(_int)
    counts: dict[str, int] = _f(_counts)  # events by kind since start
    events: tuple[MarkerEvent, ...] = _f(_list_of(MarkerEvent.from_json))


# ---- bsr.forget / bsr.configure ---------------------------------------------------------


@dataclass(frozen=True)
class ForgetReply(Reply):
    """``bsr.forget``: L1 usage before and after the clear."""

    WHAT: ClassVar[str] = "bsr.forget"

    l1_used_bytes_before: int = _f(_int)
    l1_used_bytes_after: int = _f(_int)
    force: bool = _f(_bool)  # locked objects were dropped too
    waited_s: float = _f(_float)


@dataclass(frozen=True)
class ConfigureReply(Reply):
    """``bsr.configure``: the config in effect after the call; ``error`` iff refused."""

    WHAT: ClassVar[str] = "bsr.configure"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"error"})

    ok: bool = _f(_bool)
    config: dict[str, Any] = _f(_obj)
    error: str | None = _f(_str, default=None)

    def __post_init__(self) -> None:
        if self.ok != (self.error is None):
            raise ProtocolError(f"{self.WHAT}: error is set exactly when ok is false")

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        return out if self.error is not None else {k: v for k, v in out.items() if k != "error"}


@dataclass(frozen=True)
class HoldsReply(Reply):
    """``bsr.holds``: the prompt's leading whole chunks each L2 adapter holds (a real
    lookup-and-lock, then unlock), in the storage manager's adapter order; ``error`` why
    none could be looked up."""

    WHAT: ClassVar[str] = "bsr.holds"

    chunks: int = _f(_int)  # whole chunks of the prompt
    held_chunks_by_adapter: tuple[int, ...] = _f(_ints)
    error: str = _f(_str)


# ---- a mutating method refused (bsrkv.control_token) ------------------------------------


@dataclass(frozen=True)
class RefusedReply(Reply):
    """Any mutating method called without the server's control token (or with a wrong one):
    nothing was changed. ``refused`` is always ``"control token"``."""

    WHAT: ClassVar[str] = "refused"

    ok: bool = _f(_bool)  # always false (a generic reader sees a failure)
    method: str = _f(_str)
    refused: str = _f(_str)
    error: str = _f(_str)  # names the method and what is wrong with the token

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


@dataclass(frozen=True)
class FailedReply(Reply):
    """Any ``bsr.*`` / ``tempokv.*`` method that raised inside the server (counted on the
    module's guard, ``bsrkv.hostguard``): the server went on; what the method would have
    answered is not known. ``failed`` is always ``"handler"``."""

    WHAT: ClassVar[str] = "failed"

    ok: bool = _f(_bool)  # always false
    method: str = _f(_str)
    failed: str = _f(_str)
    error: str = _f(_str)  # the exception, type and message

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
