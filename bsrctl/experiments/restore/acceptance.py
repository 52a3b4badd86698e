"""Acceptance of one restore point: named checks, pure functions over measured values.

The paper's criterion (Section 6): cached-token accounting, tier isolation, registration
identity, canonical output, post-request health, and for W > 0 the bounded restore pool.
Each function takes what was measured (None = not measured) and returns a Check; missing
evidence is UNKNOWN, never PASS. ``judge`` applies them to a point's measures
(``measures_from_json`` reads them back from evidence), so a point can be re-judged from its
evidence alone.

On the storage stack there is no model: ``canonical_output`` is replaced by
``canonical_bytes`` (every installed object compared with regenerated canonical bytes);
``judge`` picks it by the measures' type (``StorageMeasures``), not by a stack name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bsrctl.evidence import guards
from bsrctl.evidence.verdict import Check, Point, Verdict, check
from bsrctl.stack.contracts.measures import RestoreMeasures, ServingMeasures, StorageMeasures
from bsrctl.stack.launch.serving.client import NOT_REPORTED
from bsrkv.registration import first_difference


def _missing(name: str, *what: str) -> Check:
    return check(name, None, f"not measured: {', '.join(what)}")


def setup_seeded(expected_chunks: int, held_chunks: int | None, tier: str) -> Check:
    """Setup, not the code under test: the tier holds every whole chunk of the prompt before
    the restore. Short is UNKNOWN (nothing to restore from), never a FAIL of the restore."""
    name = "setup_seeded"
    if held_chunks is None:  # missing evidence, never a measured 0
        return check(name, None, f"setup: what {tier} held was not measured")
    detail = f"setup: {tier} held {held_chunks}/{expected_chunks} whole chunks of the prompt"
    return check(name, True if held_chunks == expected_chunks else None, detail)


def cached_token_accounting(
    cached_tokens: int | None,
    expected_cached_tokens: int | None,
    external_hit_tokens: int | None = None,
) -> Check:
    """Cached tokens == the chunk-aligned prefix expected (and, on serving, all external)."""
    name = "cached_token_accounting"
    if cached_tokens is None:
        return check(name, None, f"not measured: {NOT_REPORTED}")
    if expected_cached_tokens is None:
        return _missing(name, "expected tokens")
    if expected_cached_tokens <= 0:
        return check(name, None, f"expected {expected_cached_tokens} tokens: nothing to restore")
    ext = "" if external_hit_tokens is None else f", external hits {external_hit_tokens}"
    detail = f"cached {cached_tokens}{ext}, expected {expected_cached_tokens}"
    ok = cached_tokens == expected_cached_tokens and external_hit_tokens in (
        None,
        expected_cached_tokens,
    )
    return check(name, ok, detail)


def tier_isolation(
    tier: str,
    l1_bytes_before: int | None,
    cached_tokens: int | None,
    tier_reads: Mapping[str, int] | None,
    external_hit_tokens: int | None = None,
    unit: str = "B",
) -> Check:
    """The prefix came from `tier` alone: L1 empty before the request (unless L1 is the tier
    under test, ``"l1"``), vLLM's local prefix cache served nothing, the tier's own read
    counter moved and no other tier's did. ``tier_reads``: what each L2 tier read for the
    request (bytes, or keys with ``unit="keys"``); a tier it does not name read nothing."""
    name = "tier_isolation"
    missing = [
        n
        for n, v in (
            ("L1 bytes before the request", 0 if tier == "l1" else l1_bytes_before),
            ("cached tokens", cached_tokens),
            (f"{unit} read from {tier}", tier_reads),
        )
        if v is None
    ]
    if missing or cached_tokens is None or tier_reads is None:
        return _missing(name, *missing)
    if tier != "l1" and l1_bytes_before:
        return check(name, False, f"L1 held {l1_bytes_before} B before the request: not emptied")
    if external_hit_tokens is not None and cached_tokens != external_hit_tokens:
        local = cached_tokens - external_hit_tokens
        return check(
            name,
            False,
            f"{local} of {cached_tokens} cached tokens came from vLLM's local prefix cache",
        )
    others = {t: n for t, n in sorted(tier_reads.items()) if t != tier and n}
    if others:
        return check(name, False, f"other tiers served the request too: {unit} read {others}")
    if tier == "l1":
        if cached_tokens <= 0:
            return check(name, None, "0 cached tokens: nothing to say where they came from")
        return check(name, True, f"{cached_tokens} tokens from L1; no L2 tier read; local cache 0")
    own = tier_reads.get(tier, 0)
    if own <= 0:
        if cached_tokens > 0:
            return check(
                name, False, f"{cached_tokens} tokens cached but 0 {unit} read from {tier}"
            )
        return check(name, None, f"nothing was read from {tier} (0 cached tokens): no evidence")
    return check(name, True, f"L1 empty before; {own} {unit} read from {tier}; local cache 0")


def registration_identity(
    expected_bytes_per_chunk: int | None,
    measured_bytes_per_chunk: int | None,
    expected_digest: str | None = None,
    restored_digest: str | None = None,
    expected_tensors: tuple[str, ...] | None = None,
    live_tensors: tuple[str, ...] | None = None,
    stored_tensors: tuple[str, ...] | None = None,
) -> Check:
    """The restored state has the registered geometry: bytes per chunk per rank, the
    tensor-list digest where the stack reports one, and, where the stack reports them, the
    same tensors (shape, dtype, group, in order) in the derived or declared registration,
    the live one and the one recorded when the prefix was stored; a difference names the
    first tensor that differs."""
    name = "registration_identity"
    if expected_bytes_per_chunk is None or measured_bytes_per_chunk is None:
        return _missing(name, "bytes per chunk of the restored state")
    diffs = []
    if measured_bytes_per_chunk != expected_bytes_per_chunk:
        diffs.append(f"bytes per chunk {measured_bytes_per_chunk} != {expected_bytes_per_chunk}")
    if expected_digest is not None or restored_digest is not None:
        if expected_digest is None or restored_digest is None:
            return _missing(name, "one of the registration digests")
        if expected_digest != restored_digest:
            diffs.append(f"digest {restored_digest[:12]} != {expected_digest[:12]}")
        scope = f"digest {expected_digest[:12]}, "
    else:
        scope = "no digest from this stack, "
    if expected_tensors is not None:
        for what, got in (("live", live_tensors), ("stored", stored_tensors)):
            if got is None:
                return _missing(name, f"the {what} registration")
            if diff := first_difference(expected_tensors, got, what):
                diffs.append(diff)
        scope += f"{len(expected_tensors)} tensors derived == live == stored, "
    if diffs:
        return check(name, False, "; ".join(diffs))
    return check(name, True, f"{scope}{measured_bytes_per_chunk} B per chunk per rank")


def canonical_output(
    output_sha256: str | None,
    canonical_sha256: str | None,
    first_divergence: int | None = None,
    max_logprob_gap: float | None = None,
    tolerance: Mapping[str, Any] | None = None,
) -> Check:
    """Output tokens == those of the same request on the reference (no external cache, the
    deployment's TP, dtype and KV cache dtype): bit-exact; or, where the spec declares
    ``vllm.output_tolerance`` (GPU runs without batch invariance), tokens diverging only at
    or after ``min_identical_tokens`` with every top-1 logprob before the divergence within
    ``max_logprob_gap`` of the reference's; else FAIL. The first divergence and the largest
    gap before it are in the detail whenever they were measured."""
    name = "canonical_output"
    if not output_sha256 or not canonical_sha256:
        return _missing(name, "output sha256" if not output_sha256 else "canonical sha256")
    shas = f"{output_sha256[:16]} vs {canonical_sha256[:16]}"
    gap = "" if max_logprob_gap is None else f", top-1 logprob gap <= {max_logprob_gap:.3g}"
    if output_sha256 == canonical_sha256:
        return check(name, True, shas + (f": bit-exact tokens{gap}" if gap else ""))
    where = "" if first_divergence is None else f": first divergence at token {first_divergence}"
    if tolerance is None or first_divergence is None or max_logprob_gap is None:
        why = "" if tolerance is None else " (divergence or logprobs not measured)"
        return check(name, False, shas + where + gap + why)
    lo, limit = int(tolerance["min_identical_tokens"]), float(tolerance["max_logprob_gap"])
    ok = first_divergence >= lo and max_logprob_gap <= limit
    verdict = "within" if ok else "outside"
    return check(
        name,
        ok,
        f"{shas}{where}{gap}: {verdict} the stated tolerance (divergence at >= {lo}, "
        f"gap <= {limit:.3g})",
    )


def canonical_bytes(
    verify_ok: bool | None,
    mismatches: int | None,
    bytes_restored: int | None,
    objects: tuple[str, ...] | None = None,
    when: str | None = None,
    rejected: tuple[str, ...] | None = None,
) -> Check:
    """Storage stack (no model): replaces canonical_output with byte verification. Every
    pass is judged: the accuracy pass compared while installing, a timed pass after its
    timer. FAIL names the objects not canonical (their L2 files) and those the tier refused
    at load as corrupted (a restore that failed closed)."""
    name = "canonical_bytes"
    why = "storage stack has no model: canonical_output replaced by byte verification; "
    refused = ""
    if rejected:
        refused = f"; the tier refused {len(rejected)} object(s) at load as corrupted: "
        refused += _named(rejected)
    if verify_ok is None or mismatches is None:
        return check(name, None, why + "destination keeps no bytes (use destination: verify)")
    if not bytes_restored:
        return check(name, False if rejected else None, why + "0 B restored" + refused)
    ok = verify_ok and mismatches == 0 and not rejected
    compared = WHEN.get(when or "", "compared")
    bad = f": {_named(objects)}" if mismatches and objects else ""
    return check(
        name,
        ok,
        why + f"{bytes_restored} B installed, {compared}, {mismatches} object(s) not "
        f"canonical{bad}{refused}",
    )


# How the installed bytes were compared (StorageMeasures.bytes_checked).
WHEN = {"install": "compared while installing", "after_timer": "compared after the timer"}
NAMED = 8  # objects a detail names; every one is in the point (measures, timed_bad_objects)


def _named(objects: tuple[str, ...]) -> str:
    more = len(objects) - NAMED
    tail = f" (+{more} more in the point's evidence)" if more > 0 else ""
    return ", ".join(objects[:NAMED]) + tail


def install_readback(readback: Mapping[str, Any] | None, windows_done: int | None) -> Check:
    """For W > 0 on the serving stack: every installed window was read back from the
    engine's KV through LMCache's own store copy and equals the staged bytes."""
    name = "install_readback"
    if readback is None or windows_done is None:
        return _missing(name, "read-back totals" if readback is None else "windows installed")
    checked, bad = readback.get("windows_checked"), readback.get("mismatches")
    detail = (
        f"{checked} of {windows_done} window(s) read back, {readback.get('chunks_checked')} "
        f"object(s) compared, {bad} mismatch(es), {readback.get('seconds')} s, scratch "
        f"{readback.get('scratch_bytes')} B (not in W*c + aux)"
    )
    if bad:
        return check(name, False, detail)
    if not windows_done:
        return check(name, None, detail + ": nothing installed to read back")
    return check(name, checked == windows_done, detail)


def post_request_health(healthy: bool | None, detail: str = "") -> Check:
    """The stack still serves after the request (a short follow-up succeeds)."""
    name = "post_request_health"
    if healthy is None:
        return check(name, None, detail or "health not measured")
    return check(name, healthy, detail)


def bounded_restore(
    window_chunks: int | None,
    restore_pool_peak_bytes: int | None,
    bound_bytes: int | None,
    bytes_restored: int | None = None,
    bytes_per_chunk: int | None = None,
    bytes_per_chunk_allocated: int | None = None,
    allocation_unit_bytes: int | None = None,
) -> Check:
    """For W > 0: measured restore-pool peak <= W*c_allocated + aux, where c_allocated is
    what a chunk occupies in the restore pool (each group's object rounded up to LMCache's
    L1 allocation unit; the logical c beside it). Without an allocation unit the bound is
    the logical W*c + aux."""
    name = "bounded_restore"
    if window_chunks is None or restore_pool_peak_bytes is None or bound_bytes is None:
        return _missing(name, "window, restore-pool peak or bound")
    if window_chunks <= 0:
        return check(name, None, f"W = {window_chunks}: the whole-plan path has no bound")
    if restore_pool_peak_bytes == 0 and bytes_restored:
        return check(
            name, None, f"peak 0 B while {bytes_restored} B were restored: gauge saw nothing"
        )
    ok = restore_pool_peak_bytes <= bound_bytes
    rel = "<=" if ok else ">"
    if bytes_per_chunk_allocated is None or allocation_unit_bytes is None:
        what = "W*c + aux"
        per_chunk = ""
    else:
        what = "W*c_allocated + aux"
        per_chunk = (
            f"; c_allocated = {bytes_per_chunk_allocated} B at the L1 unit "
            f"{allocation_unit_bytes} B, c = {bytes_per_chunk} B"
        )
    return check(
        name,
        ok,
        f"peak {restore_pool_peak_bytes} B {rel} {what} = {bound_bytes} B "
        f"(W = {window_chunks}{per_chunk})",
    )


def judge(m: RestoreMeasures) -> tuple[Check, ...]:
    """Every acceptance check of one point, from its measures; the target's own measures
    pick its oracle and what else it is held to (serving: setup, vLLM's external hits, the
    output, the install read-back, its processes' guard failures: ``extensions_healthy``;
    storage: the registration digest, c as L1 allocates it, the installed bytes). A point
    whose prefix never fully reached its tier is judged on that alone (UNKNOWN)."""
    tier = m.tier or "L2"
    seeded: list[Check] = []
    external: int | None = None
    readback: Mapping[str, Any] | None = None
    digests: tuple[str | None, str | None] = (None, None)  # expected, restored
    allocation: tuple[int | None, int | None] = (None, None)  # c_allocated, L1 unit
    if isinstance(m, ServingMeasures):
        if m.seed_chunks_expected is not None:
            seeded.append(setup_seeded(m.seed_chunks_expected, m.seed_chunks_held, tier))
            if seeded[0].verdict != Verdict.PASS:
                return tuple(seeded)
        external, readback = m.external_hit_tokens, m.readback
        content = canonical_output(
            m.output_sha256,
            m.canonical_sha256,
            m.output_first_divergence,
            m.output_max_logprob_gap,
            m.output_tolerance,
        )
    elif isinstance(m, StorageMeasures):
        digests = (m.registration_digest_expected, m.registration_digest)
        allocation = (m.bytes_per_chunk_allocated, m.l1_allocation_unit_bytes)
        content = canonical_bytes(
            m.verify_ok,
            m.verify_mismatches,
            m.bytes_restored,
            m.mismatched_objects,
            m.bytes_checked,
            m.tier_rejected_objects,
        )
    else:  # RestoreMeasures makes no instance of its own: unreachable but for a new target
        raise TypeError(f"judge: no acceptance for {type(m).__name__}")
    checks = [
        *seeded,
        cached_token_accounting(m.cached_tokens, m.expected_cached_tokens, external),
        tier_isolation(
            tier,
            m.l1_bytes_before_restore,
            m.cached_tokens,
            None if m.tier_bytes_read is None else {tier: m.tier_bytes_read},
            external,
        ),
        registration_identity(
            m.bytes_per_chunk_expected,
            m.bytes_per_chunk_measured,
            *digests,
            m.registration_tensors_expected,
            m.registration_tensors_live,
            m.registration_tensors_stored,
        ),
        content,
        post_request_health(m.healthy, m.health_detail),
    ]
    if isinstance(m, ServingMeasures):  # the storage stack runs no host process
        checks.append(guards.judge_json(m.guards))
    if m.window_chunks > 0:
        checks.append(
            bounded_restore(
                m.window_chunks,
                m.restore_pool_peak_bytes,
                m.rws_bound_bytes,
                m.bytes_restored,
                m.bytes_per_chunk_expected,
                *allocation,
            )
        )
        # read-back on (bsrctl's default); a module an operator runs with it off is not judged
        if readback is not None and readback.get("enabled") is not False:
            checks.append(install_readback(readback, m.windows_done))
    return tuple(checks)


def restore_point(
    point_id: str, params: dict[str, Any], measures: RestoreMeasures, **extra: Any
) -> Point:
    """An evidence point judged by the acceptance checks from its own measures."""
    return Point(point_id, params, measures.to_json(), judge(measures), extra)
