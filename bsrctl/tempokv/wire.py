"""The TempoKV wire: every ``tempokv.*`` payload and the runtime adapter's launch settings,
one typed definition for the three sides that speak it (the vLLM adapter, the server
module, TempoKV serving), as ``lmcache_ext.protocol`` is for ``bsr.*``.

A record's ``to_json()`` is its JSON object; ``from_json()`` raises ``WireError`` naming
every missing and every unexpected key (and a mistyped value by its path), so a key renamed
on one side fails on the other instead of reading as 0. Every key is required: ``None``
travels as ``null``. Values are read by the fields' type hints (int, float, str, bool,
``X | None``, ``tuple[X, ...]``, ``dict[str, X]``, nested dataclasses), so the adapter's
own ``AdapterSettings`` and ``CostModel`` travel the same way (``settings_to_json`` /
``settings_from_json``) without a second definition of their fields.

Pure: no LMCache, torch or vLLM import; the adapter imports it inside vLLM's process.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar, Self

from bsrctl.tempokv.live import AdapterSettings, Update

UPDATE = "tempokv.update"
CONFIGURE = "tempokv.configure"
STATUS = "tempokv.status"


class WireError(ValueError):
    """A payload that does not have the shape its record defines."""


# ---- reading and writing by type hint ---------------------------------------------------


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def decode(cls: type, raw: Any, where: str) -> Any:
    """A dataclass from its JSON object: exactly its fields as keys, each read by type."""
    if not isinstance(raw, Mapping):
        raise WireError(f"{where}: expected a JSON object, got {raw!r}")
    names = _names(cls)
    missing, extra = sorted(set(names) - set(raw)), sorted(set(raw) - set(names))
    if missing or extra:
        raise WireError(f"{where}: missing keys {missing}, unexpected keys {extra}")
    hints = _hints(cls)
    return cls(**{n: _read(hints[n], raw[n], f"{where}.{n}") for n in names})


def encode(obj: Any) -> Any:
    """The JSON value of a dataclass (every field), tuple (list) or mapping."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {n: encode(getattr(obj, n)) for n in _names(type(obj))}
    if isinstance(obj, tuple | list):
        return [encode(x) for x in obj]
    if isinstance(obj, Mapping):
        return {str(k): encode(v) for k, v in obj.items()}
    return obj


def _read(tp: Any, v: Any, w: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _read(inner, v, w)
    if origin is tuple:
        if not isinstance(v, list):
            raise WireError(f"{w}: expected a list, got {v!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_read(args[0], x, f"{w}[{i}]") for i, x in enumerate(v))
        if len(v) != len(args):
            raise WireError(f"{w}: expected {len(args)} items, got {v!r}")
        return tuple(_read(a, x, f"{w}[{i}]") for i, (a, x) in enumerate(zip(args, v, strict=True)))
    if origin is dict:
        if not isinstance(v, Mapping):
            raise WireError(f"{w}: expected a JSON object, got {v!r}")
        return {str(k): _read(args[1], x, f"{w}.{k}") for k, x in v.items()}
    if dataclasses.is_dataclass(tp):
        return decode(tp, v, w)
    return _scalar(tp, v, w)


def _scalar(tp: Any, v: Any, w: str) -> Any:
    ok = {
        bool: isinstance(v, bool),
        int: isinstance(v, int) and not isinstance(v, bool),
        float: isinstance(v, int | float) and not isinstance(v, bool),
        str: isinstance(v, str),
    }
    if tp not in ok:
        raise TypeError(f"{w}: the wire carries no {tp!r}")  # a record's field, not a payload
    if not ok[tp]:
        raise WireError(f"{w}: expected {tp.__name__}, got {v!r}")
    return float(v) if tp is float else v


class Record:
    """``to_json`` / ``from_json`` of a frozen dataclass over its fields' type hints."""

    WHAT: ClassVar[str] = "tempokv record"

    def to_json(self) -> dict[str, Any]:
        return encode(self)

    @classmethod
    def from_json(cls, raw: Any) -> Self:
        return decode(cls, raw, cls.WHAT)


# ---- the adapter's launch settings (vLLM's BSRCTL_TEMPOKV) -------------------------------


def settings_to_json(s: AdapterSettings) -> dict[str, Any]:
    """Every field of the adapter's settings, ``cost`` as its CostModel's fields."""
    return encode(s)


def settings_from_json(raw: Any, where: str = "adapter settings") -> AdapterSettings:
    """The adapter's settings; a missing or unknown key (here or in ``cost``) is refused."""
    return decode(AdapterSettings, raw, where)


@dataclass(frozen=True)
class AdapterEnv(Record):
    """``BSRCTL_TEMPOKV`` (``--scheduler-cls`` takes only a class): the adapter's settings
    (None: the recording scheduler, no adapter), how its updates travel, its trace."""

    WHAT: ClassVar[str] = "BSRCTL_TEMPOKV"

    adapter: AdapterSettings | None
    transport: str  # "connector" (server_module_call) | "record" (kept in vLLM's process)
    trace_path: str | None  # JSON lines of every step's decision and message

    def __post_init__(self) -> None:
        if self.transport not in ("connector", "record"):
            raise WireError(f"{self.WHAT}.transport: {self.transport!r}, not connector|record")


# ---- tempokv.update: the adapter's report, and the controller's reply -------------------


@dataclass(frozen=True)
class Hit(Record):
    """What the server needs to find a new claim's objects by its own keys (a probe)."""

    WHAT: ClassVar[str] = "tempokv.update hit"

    token_ids: tuple[int, ...]  # the prompt's whole chunks
    cache_salt: str
    model_name: str
    world_size: int


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class TempoConfig(Record):
    """The controller and provider the server (re)starts (``LiveConfig``'s fields)."""

    WHAT: ClassVar[str] = f"{CONFIGURE} config"

    policy: str
    capacity_bytes: int  # the fast tier the provider models (L1's room for it)
    budget_bytes: int  # protected-capacity budget
    concurrency: int  # staging ops in flight
    prior_bytes_s: float  # staging rate prior (the shaped L2's)
    static_rate_bytes_s: float | None  # TempoKV-Static's rate (None: the prior)
    tick_s: float
    chunk_tokens: int  # must equal the server's chunk size


@dataclass(frozen=True)
class ConfigureRequest(Record):
    """``tempokv.configure``: a config, or None to turn TempoKV off."""

    WHAT: ClassVar[str] = CONFIGURE

    config: TempoConfig | None


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Stage(Record):
    """One staging op the device performed (a LOCK prefetch)."""

    WHAT: ClassVar[str] = f"{STATUS} stage"

    op: int
    bytes: int
    start_s: float
    done_s: float
    missed: int  # objects not loaded (an L2 miss)


@dataclass(frozen=True)
class TtrAtCommit(Record):
    """One commitment: its TTR estimate vs the time to stage-ready, and the TTU it was made
    on vs when its retrieval was demanded (seconds from the commit)."""

    WHAT: ClassVar[str] = f"{STATUS} ttr"

    claim: str
    ttr_est_s: float
    stage_ready_s: float | None
    ttu_est_s: float | None
    retrieval_s: float | None


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class StockReads(Record):
    WHAT: ClassVar[str] = f"{STATUS} observed_stock_reads"

    count: int
    bytes: int
    outcomes: dict[str, int]
    reads: tuple[StockReadRecord, ...]


@dataclass(frozen=True)
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
