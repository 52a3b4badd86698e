"""The contract between experiments and whatever runs a restore: a Target, and the typed
measures of one restore point.

    target.prepare(prompts)                        # canonical outputs (serving), disk (storage)
    target.deploy(l1_bytes, settings)              # a fresh deployment with this L1, W and B
    target.store(prompts)                          # seed prefixes for later deployments
    measures = target.measure(prompt, window_chunks, cold)   # seed, forget, restore, health
    target.teardown(); target.cleanup()

Made once per run from ``stack.kind`` by ``bsrctl.stack.selector.make_target``.

Every target returns one ``RestoreMeasures`` per point; acceptance reads its attributes,
evidence stores ``to_json()`` and re-judging a point reads it back with ``from_json``, which
refuses a key it does not know (a renamed measure fails loudly instead of reading None).
A stack failure raises StackFailed; the experiment decides what that means for its run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple, Protocol

from bsrkv.registration import Registration
from bsrkv.settings import RestoreSettings


class Prompt(NamedTuple):
    """A deterministic prompt: token ids drawn from (salt, tokens)."""

    salt: str
    tokens: int


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
    """One restore point, on any target. None means "not measured on this target"."""

    tokens: int  # prefix tokens requested
    window_chunks: int  # W (0 = whole plan)
    l1_capacity_bytes: int  # L1 per LMCache instance (serving) / per rank (storage)
    # -- restore pool and L1
    restore_pool_peak_bytes: int | None = None  # the gauge's high-water, max over ranks
    restore_pool_peak_bytes_by_rank: dict[str, int] | None = None
    rws_bound_bytes: int | None = None  # W * c_allocated + aux (0 on the whole-plan path)
    l1_used_peak_bytes: int | None = None  # serving: L1 occupancy sampled when staged
    l1_peak_bytes_by_rank: dict[str, int] | None = None  # storage: absolute L1 high-water
    gauge_peak_bytes_by_rank: dict[str, int] | None = None  # storage: core's accounting
    l1_usage_before_bytes: dict[str, int] | None = None  # storage, per rank
    l1_usage_after_bytes: dict[str, int] | None = None  # storage, per rank
    l1_bytes_before_restore: int | None = None  # L1 occupancy right before the restore
    # -- tokens
    cached_tokens: int | None = None
    external_hit_tokens: int | None = None  # serving: tokens vLLM got from the connector
    expected_cached_tokens: int | None = None
    cold_cached_tokens: int | None = None  # serving: cached tokens of the seeding request
    # -- bytes and where they came from
    tier: str | None = None  # "fs" | "mooncake"
    tier_bytes_read: int | None = None
    bytes_restored: int | None = None
    bytes_restored_source: str | None = None  # serving: "bsr outcomes" | "whole-plan gauge"
    bytes_per_chunk_expected: int | None = None
    bytes_per_chunk_measured: int | None = None
    # c as the restore pool holds it: every group's object rounded up to LMCache's L1
    # allocation unit, read from the allocator at runtime (storage; serving: not reported)
    bytes_per_chunk_allocated: int | None = None
    l1_allocation_unit_bytes: int | None = None
    registration_digest_expected: str | None = None
    registration_digest: str | None = None  # storage: digest of the registration restored
    # Registration.geometry() ("name=[shape] dtype gN" per tensor) of the registration the
    # spec derived or declared, of the live one (what the engine registered with LMCache;
    # storage: what the stack deployed), and of the one recorded when the prefix was stored
    registration_tensors_expected: tuple[str, ...] | None = None
    registration_tensors_live: tuple[str, ...] | None = None
    registration_tensors_stored: tuple[str, ...] | None = None
    # -- correctness
    output_sha256: str | None = None  # serving
    canonical_sha256: str | None = None  # serving
    # serving: first output token that differs from the reference's (None: identical), the
    # largest |top-1 logprob gap| before it, and the spec's vllm.output_tolerance (None:
    # bit-identical tokens asked for)
    output_first_divergence: int | None = None
    output_max_logprob_gap: float | None = None
    output_tolerance: dict[str, Any] | None = None
    verify_ok: bool | None = None  # storage: every installed byte canonical
    verify_mismatches: int | None = None  # storage
    blocks_valid: int | None = None  # storage
    blocks_total: int | None = None  # storage
    # serving: the install read-back (bsrctl.stack.contracts.readback.readback_measures):
    # windows and objects read back, mismatches, seconds, scratch bytes, the install seconds
    # beside them
    readback: dict[str, Any] | None = None
    # -- the restore itself
    budget_chunks: int | None = None  # storage: B in effect
    windows_done: int | None = None
    restore_modes: tuple[str, ...] | None = None  # serving: "bsr" | "stock" per outcome
    restore_failures: tuple[str, ...] | None = None  # serving: detail of each failed outcome
    failure: str | None = None  # storage: "" when committed
    forced_local: bool | None = None  # storage
    # serving: the restore request's X-Request-Id (its spans carry it): what a report's
    # timeline shows, never the seeding requests before it
    request_id: str | None = None
    # -- time
    ttft_s: float | None = None  # serving: vLLM's own TTFT histogram delta
    # from the lookup of the prefix to the last byte installed, alike at W = 0 and W > 0
    restore_s: float | None = None
    probe_s: float | None = None  # storage
    retrieve_s: float | None = None  # the retrieve alone (serving: the slowest rank's)
    # -- setup
    seed_chunks_expected: int | None = None
    seed_chunks_held: int | None = None
    seed: SeedRecord | None = None  # serving
    seed_objects_written: int | None = None  # storage
    seed_s: float | None = None  # storage
    # -- after the request
    healthy: bool | None = None
    health_detail: str = ""
    error: str | None = None  # the stack failed: what was raised

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RestoreMeasures:
        """Read back a point's measures; an unknown key is an error, not a silent None."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ValueError(f"unknown restore measure(s) {unknown}; known: {sorted(known)}")
        d = dict(doc)
        for name in (
            "restore_modes",
            "restore_failures",
            "registration_tensors_expected",
            "registration_tensors_live",
            "registration_tensors_stored",
        ):
            if d.get(name) is not None:
                d[name] = tuple(d[name])
        if d.get("seed") is not None:
            s = dict(d["seed"])
            s["attempts"] = tuple(s["attempts"])
            d["seed"] = SeedRecord(**s)
        return cls(**d)


def exact_div(a: int | None, b: int) -> int | None:
    """a / b when both say something (a > 0, b > 0) and it divides exactly, else None."""
    return a // b if a and b > 0 and a % b == 0 else None


class Target(Protocol):
    """What ladder, sweep and law drive: a serving deployment (launched or attached) or the
    storage stack. One instance per run, made by ``bsrctl.stack.selector.make_target``."""

    kind: str  # the run's stack.kind: "serving" | "attach" | "storage"
    reg: Registration  # the geometry restored: c and the digest are checked against it
    on_phase: Callable[[str], None]  # told each step of a point (seed, forget, restore, ...)

    def prepare(self, prompts: list[Prompt]) -> None:
        """Before any deployment: canonical outputs, disk room; BadInput when impossible."""

    def fits(self, l1_bytes: int) -> tuple[bool, str]:
        """Whether an L1 of this size fits the machine, and the numbers behind the answer."""

    def l1_bytes(self, asked: int) -> int:
        """The L1 a deployment asked for `asked` bytes runs with (attached: the operator's,
        known once ``prepare`` connected); what the console shows."""

    def deploy(self, l1_bytes: int, settings: RestoreSettings) -> None:
        """A fresh deployment with this L1 and these restore settings."""

    def describe(self) -> dict[str, Any]:
        """The evidence's `stack` block: kind, versions, registration, endpoints."""

    def store(self, prompts: list[Prompt]) -> None:
        """Seed every prompt's prefix into the L2 tier (later deployments restore it)."""

    def measure(
        self, prompt: Prompt, window_chunks: int, cold: bool = True, oracle: bool = True
    ) -> RestoreMeasures:
        """One restore point: seed (when cold), forget locally, restore with W, check health.
        ``oracle``: the accuracy pass (serving: the install read-back; storage: every
        installed byte compared); off, the timed production path."""

    def forget_salt_files(self) -> None:
        """Bound disk before a new salt: drop the L2 files of the prompts measured so far
        (the storage stack's own files; a serving deployment's L2 is its own: nothing)."""

    def teardown(self) -> None:
        """Let this deployment go (launched: every process by PID; attached: the operator's
        settings given back); the run's files stay."""

    def cleanup(self) -> None:
        """After the run: teardown, and remove what the run no longer needs."""
