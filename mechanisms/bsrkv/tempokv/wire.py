"""The TempoKV wire: every ``tempokv.*`` payload and the runtime adapter's launch settings,
one typed definition for the three sides that speak it (the vLLM adapter, the server
module, TempoKV serving), as ``lmcache_ext.bsr.protocol`` is for ``bsr.*``.

A record is a frozen ``bsrkv.strictjson`` struct (msgspec, ``tempokv.codec``): its
``to_json()`` is its JSON object; ``from_json()`` raises ``WireError`` naming every missing
and every unexpected key (and a mistyped value by its path, nothing coerced), so a key
renamed on one side fails on the other instead of reading as 0. Every key is required:
``None`` travels as ``null``. The adapter's own ``AdapterSettings`` and ``CostModel``
(dataclasses) travel the same way (``settings_to_json`` / ``settings_from_json``) without a
second definition of their fields.

Pure: no LMCache, torch or vLLM import; the adapter imports it inside vLLM's process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from bsrkv.tempokv.codec import Record, WireError, decode, encode
from bsrkv.tempokv.live import AdapterSettings, Update

UPDATE = "tempokv.update"
CONFIGURE = "tempokv.configure"
STATUS = "tempokv.status"


# ---- the adapter's launch settings (vLLM's BSRKV_TEMPOKV) -------------------------------


def settings_to_json(s: AdapterSettings) -> dict[str, Any]:
    """Every field of the adapter's settings, ``cost`` as its CostModel's fields."""
    return encode(s)


def settings_from_json(raw: Any, where: str = "adapter settings") -> AdapterSettings:
    """The adapter's settings; a missing or unknown key (here or in ``cost``) is refused."""
    return decode(AdapterSettings, raw, where)


class AdapterEnv(Record):
    """``BSRKV_TEMPOKV`` (``--scheduler-cls`` takes only a class): the adapter's settings
    (None: the recording scheduler, no adapter), how its updates travel, its trace."""

    WHAT: ClassVar[str] = "BSRKV_TEMPOKV"

    adapter: AdapterSettings | None
    transport: str  # "connector" (server_module_call) | "record" (kept in vLLM's process)
    trace_path: str | None  # JSON lines of every step's decision and message

    def __post_init__(self) -> None:
        if self.transport not in ("connector", "record"):
            raise WireError(f"{self.WHAT}.transport: {self.transport!r}, not connector|record")


# ---- tempokv.update: the adapter's report, and the controller's reply -------------------


class Hit(Record):
    """What the server needs to find a new claim's objects by its own keys (a probe)."""

    WHAT: ClassVar[str] = "tempokv.update hit"

    token_ids: tuple[int, ...]  # the prompt's whole chunks
    cache_salt: str
    model_name: str
    world_size: int


class UpdateRequest(Record):
    """``tempokv.update``: new claims (with their hits), cancellations, the whole waiting
    order and the claimed requests' projected TTUs."""

    WHAT: ClassVar[str] = UPDATE

    at_s: float
    report: tuple[str, ...]
    cancel: tuple[str, ...]
    order: tuple[str, ...]
    ttus_s: dict[str, float]
    hits: dict[str, Hit]  # one per reported claim whose request the scheduler still holds

    @classmethod
    def of(cls, u: Update, hits: Mapping[str, Hit] | None = None) -> UpdateRequest:
        """The adapter core's update on the wire (times to the microsecond)."""
        ttus = {k: round(v, 6) for k, v in u.ttus_s.items()}
        return cls(round(u.at_s, 6), u.report, u.cancel, u.order, ttus, dict(hits or {}))


class UpdateReply(Record):
    """The controller's answer: each new claim's hit, the claimed requests' staging ETA,
    and what its policy reads (``off``: TempoKV is off, nothing is claimed)."""

    WHAT: ClassVar[str] = f"{UPDATE} reply"

    hit_tokens: dict[str, int]
    eta_s: dict[str, float]
    off: bool
    needs_ttu: bool | None  # None exactly when off
    ttu_quantile: float | None  # TempoKV-U's quantile, None for the other policies

    def __post_init__(self) -> None:
        if self.off != (self.needs_ttu is None):
            raise WireError(f"{self.WHAT}: needs_ttu is null exactly when off")

    @classmethod
    def turned_off(cls) -> UpdateReply:
        return cls({}, {}, True, None, None)


# ---- tempokv.configure ------------------------------------------------------------------


class TempoConfig(Record):
    """The controller and provider the server (re)starts (``LiveConfig``'s fields)."""

    WHAT: ClassVar[str] = f"{CONFIGURE} config"

    policy: str
    capacity_bytes: int  # the fast tier the provider models (L1's room for it)
    budget_bytes: int  # protected-capacity budget
    concurrency: int  # staging ops in flight
    prior_bytes_s: float  # staging rate prior (the shaped L2's)
    prior_latency_s: float  # the shaped L2's per-op latency (the device progress estimate)
    static_rate_bytes_s: float | None  # TempoKV-Static's rate (None: the prior)
    tick_s: float
    chunk_tokens: int  # must equal the server's chunk size
    # "l2": stage from the shaped L2 into DRAM L1 (LOCK prefetch); "dax": L1 is the flash
    # tier's arena, staging is mlock of its ranges (``lmcache_ext/tempokv/flash.py``)
    tier: str = "l2"

    def __post_init__(self) -> None:
        if self.tier not in ("l2", "dax"):
            raise WireError(f"{self.WHAT}.tier: {self.tier!r}, not l2|dax")


class ConfigureRequest(Record):
    """``tempokv.configure``: a config, or None to turn TempoKV off."""

    WHAT: ClassVar[str] = CONFIGURE

    config: TempoConfig | None


class ConfigureReply(Record):
    """The config in effect after the call (None: off); ``error`` exactly when refused."""

    WHAT: ClassVar[str] = f"{CONFIGURE} reply"

    ok: bool
    config: TempoConfig | None
    error: str | None

    def __post_init__(self) -> None:
        if self.ok != (self.error is None):
            raise WireError(f"{self.WHAT}: error is set exactly when ok is false")


# ---- tempokv.status ---------------------------------------------------------------------


class Stage(Record):
    """One staging op the device performed (a LOCK prefetch)."""

    WHAT: ClassVar[str] = f"{STATUS} stage"

    op: int
    bytes: int
    start_s: float
    done_s: float
    missed: int  # objects not loaded (an L2 miss)


class TtrAtCommit(Record):
    """One commitment: its TTR estimate vs the time to stage-ready, and the TTU it was made
    on vs when its retrieval was demanded (seconds from the commit)."""

    WHAT: ClassVar[str] = f"{STATUS} ttr"

    claim: str
    ttr_est_s: float
    stage_ready_s: float | None
    ttu_est_s: float | None
    retrieval_s: float | None


class StockReadRecord(Record):
    """One stock lookup's L2 read as the provider observed it."""

    WHAT: ClassVar[str] = f"{STATUS} stock read"

    request: str
    read: str  # the claim's id (ORDINARY claim) or "stock:<id>"
    claimed: bool
    ops: tuple[int, ...]
    objects: int
    bytes: int
    start_s: float
    done_s: float | None
    end_s: float | None
    chunks_found: int | None
    outcome: str  # done | dropped | adopted | expired | ended | open


class StockReads(Record):
    WHAT: ClassVar[str] = f"{STATUS} observed_stock_reads"

    count: int
    bytes: int
    outcomes: dict[str, int]
    reads: tuple[StockReadRecord, ...]


class StatusReply(Record):
    """``tempokv.status`` while a policy runs (off: ``OFF_STATUS``)."""

    WHAT: ClassVar[str] = STATUS

    policy: str
    timed: bool
    budget_bytes: int
    claims: dict[str, tuple[tuple[float, str], ...]]  # claim -> [t_s, state] transitions
    attempts: int
    deferred_claims: int
    retrievals: dict[str, str]  # claim -> grant (READY | WAIT | ORDINARY)
    c_byte_s: float  # the sampled pins' integral
    peak_locked_bytes: int
    peak_reserved_bytes: int
    samples: int
    model_c_byte_s: float  # the provider's reserved-from-commit byte-time
    stages: tuple[Stage, ...]
    ttr: tuple[TtrAtCommit, ...]
    observed_stock_reads: StockReads
    locked_bytes_now: int
    reports_dropped: dict[str, int]  # the server's tempokv_* counters


OFF_STATUS: dict[str, Any] = {"policy": None}


def status_from_json(raw: Any) -> StatusReply | None:
    """``tempokv.status``'s reply: None when TempoKV is off."""
    return None if raw == OFF_STATUS else StatusReply.from_json(raw)


RECORDS: tuple[type[Record], ...] = (
    AdapterEnv,
    Hit,
    UpdateRequest,
    UpdateReply,
    TempoConfig,
    ConfigureRequest,
    ConfigureReply,
    Stage,
    TtrAtCommit,
    StockReadRecord,
    StockReads,
    StatusReply,
)

__all__ = [
    "CONFIGURE",
    "OFF_STATUS",
    "RECORDS",
    "STATUS",
    "UPDATE",
    "AdapterEnv",
    "ConfigureReply",
    "ConfigureRequest",
    "Hit",
    "Record",
    "StatusReply",
    "TempoConfig",
    "UpdateReply",
    "UpdateRequest",
    "WireError",
    "decode",
    "encode",
    "settings_from_json",
    "settings_to_json",
    "status_from_json",
]
