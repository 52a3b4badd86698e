"""The typed measures of one restore point: what every target measures (``RestoreMeasures``)
and what only one does (``ServingMeasures``, ``StorageMeasures``). A field is common when
both targets set it; a field one target never sets lives on the other's type only.

Evidence stores ``to_json()``: flat, every field of the point's type plus ``"target":
"serving" | "storage"``. ``measures_from_json`` reads it back as that type and refuses a key
the type does not have (a renamed measure fails loudly instead of reading None). Evidence
written before the split has no ``target`` key and carries every field of both targets (the
other target's null): the reader infers the target from the target-only keys that hold a
value (``measures_from_json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal

TargetName = Literal["serving", "storage"]


@dataclass(frozen=True)
class SeedRecord:
    """How a prompt's prefix reached the tier the restore reads (serving)."""

    tier: str  # "fs" | "mooncake"
    chunks: int  # whole chunks of the prompt
    held_chunks: int  # chunks the tier held (per rank, the least) after the last attempt
    attempts: tuple[dict[str, int], ...]  # per cold request: cached_tokens, held_chunks
    seed_s: float


@dataclass(frozen=True)
class RestoreMeasures:
    """What both targets measure of one restore point; None: not measured at this point.
    Only its target types are made (``ServingMeasures``, ``StorageMeasures``): every point
    names the target that measured it, so acceptance knows which oracle judges it."""

    target: ClassVar[TargetName]

    tokens: int  # prefix tokens requested
    window_chunks: int  # W (0 = whole plan)
    l1_capacity_bytes: int  # L1 per LMCache instance (serving) / per rank (storage)
    # -- restore pool and L1
    restore_pool_peak_bytes: int | None = None  # the gauge's high-water, max over ranks
    restore_pool_peak_bytes_by_rank: dict[str, int] | None = None
    rws_bound_bytes: int | None = None  # W * c_allocated + aux (0 on the whole-plan path)
    l1_bytes_before_restore: int | None = None  # L1 occupancy right before the restore
    # -- tokens
    cached_tokens: int | None = None
    expected_cached_tokens: int | None = None
    # -- bytes and where they came from
    tier: str | None = None  # "fs" | "mooncake"
    tier_bytes_read: int | None = None
    bytes_restored: int | None = None
    bytes_per_chunk_expected: int | None = None
    bytes_per_chunk_measured: int | None = None
    # Registration.geometry() ("name=[shape] dtype gN" per tensor) of the registration the
    # spec derived or declared, of the live one (what the engine registered with LMCache;
    # storage: what the stack deployed), and of the one recorded when the prefix was stored
    registration_tensors_expected: tuple[str, ...] | None = None
    registration_tensors_live: tuple[str, ...] | None = None
    registration_tensors_stored: tuple[str, ...] | None = None
    # -- the restore itself
    windows_done: int | None = None
    # -- time: from the lookup of the prefix to the last byte installed, alike at W = 0 and
    # W > 0; the retrieve alone (serving: the slowest rank's)
    restore_s: float | None = None
    retrieve_s: float | None = None
    # -- after the request
    healthy: bool | None = None
    health_detail: str = ""
    error: str | None = None  # the stack failed: what was raised

    def __post_init__(self) -> None:
        if not hasattr(type(self), "target"):
            raise TypeError(
                f"{type(self).__name__} names no target: make ServingMeasures or StorageMeasures"
            )

    def to_json(self) -> dict[str, Any]:
        """Flat: the target, then every field of this type."""
        return {"target": self.target, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class ServingMeasures(RestoreMeasures):
    """A point on a serving deployment (launched or attached): vLLM's own accounting, the
    output against the reference, the install read-back, how the prefix was seeded."""

    target: ClassVar[TargetName] = "serving"

    l1_used_peak_bytes: int | None = None  # L1 occupancy sampled when staged
    external_hit_tokens: int | None = None  # tokens vLLM got from the connector
    cold_cached_tokens: int | None = None  # cached tokens of the seeding request
    bytes_restored_source: str | None = None  # "bsr outcomes" | "whole-plan gauge"
    output_sha256: str | None = None
    canonical_sha256: str | None = None
    # the first output token that differs from the reference's (None: identical), the largest
    # |top-1 logprob gap| before it, and the spec's vllm.output_tolerance (None: bit-identical
    # tokens asked for)
    output_first_divergence: int | None = None
    output_max_logprob_gap: float | None = None
    output_tolerance: dict[str, Any] | None = None
    # the install read-back (bsrctl.stack.contracts.readback.readback_measures): windows and
    # objects read back, mismatches, seconds, scratch bytes, the install seconds beside them
    readback: dict[str, Any] | None = None
    restore_modes: tuple[str, ...] | None = None  # "bsr" | "stock" per outcome
    restore_failures: tuple[str, ...] | None = None  # detail of each failed outcome
    # the restore request's X-Request-Id (its spans carry it): what a report's timeline
    # shows, never the seeding requests before it
    request_id: str | None = None
    ttft_s: float | None = None  # vLLM's own TTFT histogram delta
    seed_chunks_expected: int | None = None
    seed_chunks_held: int | None = None
    seed: SeedRecord | None = None
    # the guard failures of the deployment's processes over the point
    # (``bsrctl.evidence.guards.GuardDelta.to_json`` each; None: not read)
    guards: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True, kw_only=True)
class StorageMeasures(RestoreMeasures):
    """A point on the storage stack (LMCache's StorageManager per rank, no model): L1 per
    rank, the core's accounting, c as L1 allocates it, the installed bytes compared."""

    target: ClassVar[TargetName] = "storage"

    l1_peak_bytes_by_rank: dict[str, int] | None = None  # absolute L1 high-water
    gauge_peak_bytes_by_rank: dict[str, int] | None = None  # the core's accounting
    l1_usage_before_bytes: dict[str, int] | None = None  # per rank
    l1_usage_after_bytes: dict[str, int] | None = None  # per rank
    # c as the restore pool holds it: every group's object rounded up to LMCache's L1
    # allocation unit, read from the allocator at runtime
    bytes_per_chunk_allocated: int | None = None
    l1_allocation_unit_bytes: int | None = None
    registration_digest_expected: str | None = None
    registration_digest: str | None = None  # digest of the registration restored
    verify_ok: bool | None = None  # every installed byte canonical (None: not compared)
    verify_mismatches: int | None = None
    mismatched_objects: tuple[str, ...] | None = None  # their L2 files
    # when the installed bytes were compared: "install" (inside restore_s: the accuracy
    # pass's oracle), "after_timer" (the timed passes: after restore_s ended), "none"
    bytes_checked: str | None = None
    bytes_check_s: float | None = None  # the after-timer compare's seconds: never sampled
    tier_integrity: str | None = None  # what L2 verifies at load: a checksum or "none"
    tier_rejected_objects: tuple[str, ...] | None = None  # L2 files it refused as bad
    blocks_valid: int | None = None
    blocks_total: int | None = None
    budget_chunks: int | None = None  # B in effect
    failure: str | None = None  # "" when committed
    forced_local: bool | None = None
    probe_s: float | None = None
    seed_objects_written: int | None = None
    seed_s: float | None = None


# Each target type by the name it writes into evidence (its own ``target``).
TARGETS: dict[str, type[RestoreMeasures]] = {
    c.target: c for c in (ServingMeasures, StorageMeasures)
}
# The measures a restore target of each stack.kind returns (attach: a serving deployment
# bsrctl did not start).
BY_STACK_KIND: dict[str, type[RestoreMeasures]] = {**TARGETS, "attach": ServingMeasures}
# Read back from JSON lists.
_TUPLES = frozenset({
    "mismatched_objects",
    "tier_rejected_objects",
    "restore_modes",
    "restore_failures",
    "registration_tensors_expected",
    "registration_tensors_live",
    "registration_tensors_stored",
    "guards",
})  # fmt: skip


def names(cls: type[RestoreMeasures]) -> frozenset[str]:
    """Every field of a measures type."""
    return frozenset(f.name for f in fields(cls))


def own_names(cls: type[RestoreMeasures]) -> frozenset[str]:
    """The fields only this target's type has."""
    return names(cls) - names(RestoreMeasures)


def exact_div(a: int | None, b: int) -> int | None:
    """a / b when both say something (a > 0, b > 0) and it divides exactly, else None."""
    return a // b if a and b > 0 and a % b == 0 else None


def _refuse_unknown(d: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown restore measure(s) {unknown}{where}; known: {sorted(known)}")


def _legacy_type(d: dict[str, Any]) -> type[RestoreMeasures]:
    """The target of measures written before ``target`` was: the one whose own keys hold a
    value; the other target's keys (all null) are dropped from ``d``. No own key of either
    holding a value (a ladder rung whose stack failed before it measured anything): read as
    serving, stack.kind's default, not as a third, untargeted type that acceptance could not
    judge. Nothing target-only was measured, so nothing is lost, and the verdict cannot
    change: a serving judge finds no output (canonical_output UNKNOWN, never PASS) as a
    storage one finds no compared bytes (canonical_bytes UNKNOWN)."""
    _refuse_unknown(d, names(ServingMeasures) | names(StorageMeasures), " (no target)")
    held = {t: sorted(k for k in own_names(c) if d.get(k) is not None) for t, c in TARGETS.items()}
    if held["serving"] and held["storage"]:
        raise ValueError(
            f"restore measures without a target hold measures of both targets: serving "
            f"{held['serving']}, storage {held['storage']}"
        )
    cls = StorageMeasures if held["storage"] else ServingMeasures
    for other in TARGETS.values():
        if other is not cls:
            for k in own_names(other):
                d.pop(k, None)
    return cls


def measures_from_json(doc: Mapping[str, Any]) -> RestoreMeasures:
    """A point's measures read back from evidence, as the type its ``target`` names (legacy
    evidence without one: ``_legacy_type``); an unknown key is an error, not a silent None."""
    d = dict(doc)
    if "target" in d:
        name = d.pop("target")
        cls = TARGETS.get(name) if isinstance(name, str) else None
        if cls is None:
            raise ValueError(f"restore measures' target {name!r}: known {sorted(TARGETS)}")
        _refuse_unknown(d, names(cls), f" (target {name})")
    else:
        cls = _legacy_type(d)
    for k in _TUPLES & d.keys():
        if d[k] is not None:
            d[k] = tuple(d[k])
    if d.get("seed") is not None:
        s = dict(d["seed"])
        s["attempts"] = tuple(s["attempts"])
        d["seed"] = SeedRecord(**s)
    return cls(**d)
