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
from collections.abc import Callable, Mapping
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
# Each type's reader and writer is built once (cached): the adapter reads and writes these
# on vLLM's engine loop, where a per-value walk over typing's introspection cost 5-10x more.

Reader = Callable[[Any, str], Any]


def decode(cls: type, raw: Any, where: str) -> Any:
    """A dataclass from its JSON object: exactly its fields as keys, each read by type."""
    return _reader(cls)(raw, where)


def encode(obj: Any) -> Any:
    """The JSON value of a dataclass (every field), tuple (list) or mapping."""
    return _writer(type(obj))(obj)


@cache
def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


@cache
def _reader(tp: Any) -> Reader:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        read_inner = _reader(inner)
        return lambda v, w: None if v is None else read_inner(v, w)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if args[0] in _SCALARS:
            return _scalars_reader(args[0])
        item = _reader(args[0])

        def read_list(v: Any, w: str) -> tuple[Any, ...]:
            if not isinstance(v, list):
                raise WireError(f"{w}: expected a list, got {v!r}")
            return tuple(item(x, f"{w}[{i}]") for i, x in enumerate(v))

        return read_list
    if origin is tuple:
        items = [_reader(a) for a in args]

        def read_fixed(v: Any, w: str) -> tuple[Any, ...]:
            if not isinstance(v, list) or len(v) != len(items):
                raise WireError(f"{w}: expected {len(items)} items, got {v!r}")
            return tuple(r(x, f"{w}[{i}]") for i, (r, x) in enumerate(zip(items, v, strict=True)))

        return read_fixed
    if origin is dict:
        value = _reader(args[1])

        def read_map(v: Any, w: str) -> dict[str, Any]:
            if not isinstance(v, Mapping):
                raise WireError(f"{w}: expected a JSON object, got {v!r}")
            return {str(k): value(x, f"{w}.{k}") for k, x in v.items()}

        return read_map
    if dataclasses.is_dataclass(tp):
        return _record_reader(tp)
    return _scalar_reader(tp)


def _record_reader(cls: type) -> Reader:
    names = frozenset(n for n, _ in _fields(cls))
    readers = [(n, _reader(h)) for n, h in _fields(cls)]

    def read_record(raw: Any, where: str) -> Any:
        if not isinstance(raw, Mapping):
            raise WireError(f"{where}: expected a JSON object, got {raw!r}")
        if raw.keys() != names:
            missing, extra = sorted(names - set(raw)), sorted(set(raw) - names)
            raise WireError(f"{where}: missing keys {missing}, unexpected keys {extra}")
        return cls(**{n: r(raw[n], f"{where}.{n}") for n, r in readers})

    return read_record


_SCALARS = (int, float, str, bool)


def _scalars_reader(tp: type) -> Reader:
    """A list of one scalar type (a hit's token ids: thousands of them, read on the server's
    request thread ahead of the lookups): checked in one pass over the items' types, the
    offending index found only when one is wrong."""
    item = _scalar_reader(tp)
    allowed = {int, float} if tp is float else {tp}

    def read_scalars(v: Any, w: str) -> tuple[Any, ...]:
        if not isinstance(v, list):
            raise WireError(f"{w}: expected a list, got {v!r}")
        if not set(map(type, v)) <= allowed:
            for i, x in enumerate(v):
                item(x, f"{w}[{i}]")  # raises, naming the first wrong item
        return tuple(map(float, v)) if tp is float else tuple(v)

    return read_scalars


def _scalar_reader(tp: Any) -> Reader:
    if tp is bool:
        ok: Callable[[Any], bool] = lambda v: isinstance(v, bool)  # noqa: E731
    elif tp is int:
        ok = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    elif tp is float:
        ok = lambda v: isinstance(v, int | float) and not isinstance(v, bool)  # noqa: E731
    elif tp is str:
        ok = lambda v: isinstance(v, str)  # noqa: E731
    else:
        raise TypeError(f"the wire carries no {tp!r}")  # a record's field, not a payload
    as_float = tp is float

    def read_scalar(v: Any, w: str) -> Any:
        if not ok(v):
            raise WireError(f"{w}: expected {tp.__name__}, got {v!r}")
        return float(v) if as_float else v

    return read_scalar


@cache
def _writer(tp: type) -> Callable[[Any], Any]:
    if dataclasses.is_dataclass(tp):
        fields = [(n, _field_writer(h)) for n, h in _fields(tp)]
        return lambda obj: {n: w(getattr(obj, n)) for n, w in fields}
    if issubclass(tp, tuple | list):
        return lambda obj: [encode(x) for x in obj]
    if issubclass(tp, Mapping):
        return lambda obj: {str(k): encode(v) for k, v in obj.items()}
    return lambda obj: obj


@cache
def _field_writer(hint: Any) -> Callable[[Any], Any]:
    """A field's writer from its type hint: a tuple of scalars (a hit's token ids) is one
    ``list`` call, not an ``encode`` per item; anything else by its value's type."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        if args[0] in _SCALARS:
            return list
    return encode


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
    prior_latency_s: float  # the shaped L2's per-op latency (the device progress estimate)
    static_rate_bytes_s: float | None  # TempoKV-Static's rate (None: the prior)
    tick_s: float
    chunk_tokens: int  # must equal the server's chunk size
    # "l2": stage from the shaped L2 into DRAM L1 (LOCK prefetch); "dax": L1 is the flash
    # tier's arena, staging is mlock of its ranges (``lmcache_ext/tempokv_dax``)
    tier: str = "l2"

    def __post_init__(self) -> None:
        if self.tier not in ("l2", "dax"):
            raise WireError(f"{self.WHAT}.tier: {self.tier!r}, not l2|dax")


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
