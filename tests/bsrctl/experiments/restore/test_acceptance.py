"""The acceptance checks of one point, as pure functions: PASS only on complete evidence."""

from __future__ import annotations

import dataclasses

import pytest

from bsrctl.evidence import Verdict
from bsrctl.experiments.restore import acceptance as acc
from bsrctl.stack.contracts.measures import (
    RestoreMeasures,
    ServingMeasures,
    StorageMeasures,
    measures_from_json,
    names,
)

SHA_A = "a" * 64
SHA_B = "b" * 64
C = 262_144
CLEAN = {"source": "LMCache server", "failures": [], "note": ""}
STOCK_BOOKS = {"guard": "bsrkv.lmcache_ext.server", "site": "stock_books", "type": "KeyError",
               "count": 3}  # fmt: skip


def serving_measures(**over: object) -> ServingMeasures:
    m: dict[str, object] = {
        "tokens": 4096,
        "window_chunks": 4,
        "l1_capacity_bytes": 64 * C,
        "cached_tokens": 4095,
        "external_hit_tokens": 4095,
        "expected_cached_tokens": 4095,
        "tier": "fs",
        "l1_bytes_before_restore": 0,
        "tier_bytes_read": 16 * C,
        "bytes_per_chunk_expected": C,
        "bytes_per_chunk_measured": C,
        "output_sha256": SHA_A,
        "canonical_sha256": SHA_A,
        "healthy": True,
        "health_detail": "follow-up returned 4/4 tokens",
        "guards": (CLEAN,),
        "restore_pool_peak_bytes": 4 * C,
        "rws_bound_bytes": 4 * C,
        "bytes_restored": 16 * C,
    }
    m.update(over)
    return ServingMeasures(**m)  # type: ignore[arg-type]


def verdicts(m: RestoreMeasures) -> dict[str, Verdict]:
    return {c.name: c.verdict for c in acc.judge(m)}


def test_a_clean_serving_point_passes_every_check_in_order() -> None:
    checks = acc.judge(serving_measures())
    assert [c.name for c in checks] == [
        "cached_token_accounting",
        "tier_isolation",
        "registration_identity",
        "canonical_output",
        "post_request_health",
        "extensions_healthy",
        "bounded_restore",
    ]
    assert {c.verdict for c in checks} == {Verdict.PASS}


def test_w0_has_no_bounded_restore_check() -> None:
    names = [c.name for c in acc.judge(serving_measures(window_chunks=0))]
    assert "bounded_restore" not in names


def test_missing_evidence_is_unknown_never_pass() -> None:
    checks = acc.judge(ServingMeasures(4096, 4, C))
    assert {c.verdict for c in checks} == {Verdict.UNKNOWN}
    assert all(
        "not measured" in c.detail or "health" in c.detail or "not read" in c.detail for c in checks
    )
    assert {c.verdict for c in acc.judge(StorageMeasures(4096, 0, C))} == {Verdict.UNKNOWN}
    with pytest.raises(TypeError, match="names no target: make ServingMeasures or Storage"):
        RestoreMeasures(4096, 4, C)  # only a target's own measures are judged


@pytest.mark.parametrize(
    ("over", "name", "verdict", "needle"),
    [
        # accounting: short by a chunk, or part of it from the local cache
        ({"cached_tokens": 3840, "external_hit_tokens": 3840}, "cached_token_accounting",
         Verdict.FAIL, "cached 3840, external hits 3840, expected 4095"),
        ({"expected_cached_tokens": 0}, "cached_token_accounting", Verdict.UNKNOWN,
         "nothing to restore"),
        # tier isolation: L1 not emptied, local prefix cache served, no bytes from the tier
        ({"l1_bytes_before_restore": C}, "tier_isolation", Verdict.FAIL, "not emptied"),
        ({"external_hit_tokens": 3840}, "tier_isolation", Verdict.FAIL,
         "255 of 4095 cached tokens came from vLLM's local prefix cache"),
        ({"tier_bytes_read": 0}, "tier_isolation", Verdict.FAIL, "0 B read from fs"),
        ({"tier_bytes_read": 0, "cached_tokens": 0, "external_hit_tokens": 0},
         "tier_isolation", Verdict.UNKNOWN, "no evidence"),
        # registration: another geometry restored
        ({"bytes_per_chunk_measured": C // 2}, "registration_identity", Verdict.FAIL,
         "bytes per chunk 131072 != 262144"),
        ({"bytes_per_chunk_measured": None}, "registration_identity", Verdict.UNKNOWN,
         "not measured"),
        # altered output / wrong salt's canonical
        ({"output_sha256": SHA_B}, "canonical_output", Verdict.FAIL, "bbbbbbbb"),
        ({"canonical_sha256": None}, "canonical_output", Verdict.UNKNOWN, "canonical sha256"),
        # unhealthy engine after the request
        ({"healthy": False, "health_detail": "follow-up returned 0/4 tokens"},
         "post_request_health", Verdict.FAIL, "0/4"),
        ({"healthy": None, "health_detail": "stack failed: vLLM gone"},
         "post_request_health", Verdict.UNKNOWN, "vLLM gone"),
        # bounded restore: peak over W*c + aux, or a gauge that saw nothing
        ({"restore_pool_peak_bytes": 4 * C + 1}, "bounded_restore", Verdict.FAIL,
         f"peak {4 * C + 1} B > W*c + aux = {4 * C} B (W = 4)"),
        ({"restore_pool_peak_bytes": 0}, "bounded_restore", Verdict.UNKNOWN, "gauge saw nothing"),
        # an extension that degraded to stock; counts never read
        ({"guards": ({**CLEAN, "failures": [STOCK_BOOKS]},)}, "extensions_healthy",
         Verdict.FAIL, "LMCache server: bsrkv.lmcache_ext.server [stock_books] KeyError x3"),
        ({"guards": None}, "extensions_healthy", Verdict.UNKNOWN,
         "guard failures not read at this point"),
        ({"guards": ({**CLEAN, "failures": None, "note": "bsr.status failed: gone"},)},
         "extensions_healthy", Verdict.UNKNOWN,
         "guard failures not read: LMCache server (bsr.status failed: gone)"),
    ],
)  # fmt: skip
def test_each_check_fails_or_is_unknown_with_its_reason(
    over: dict[str, object], name: str, verdict: Verdict, needle: str
) -> None:
    (c,) = [c for c in acc.judge(serving_measures(**over)) if c.name == name]
    assert c.verdict == verdict, c
    assert needle in c.detail, c.detail


def test_storage_replaces_canonical_output_with_byte_verification() -> None:
    # the same point's common measures; storage has no output and no vLLM accounting
    common = {k: v for k, v in serving_measures().to_json().items() if k in names(RestoreMeasures)}
    m = StorageMeasures(
        **common,
        verify_ok=True,
        verify_mismatches=0,
        registration_digest="d" * 64,
        registration_digest_expected="d" * 64,
    )
    v = verdicts(m)
    assert "canonical_output" not in v and v["canonical_bytes"] == Verdict.PASS
    (c,) = [c for c in acc.judge(m) if c.name == "canonical_bytes"]
    assert "canonical_output replaced by byte verification" in c.detail
    m = dataclasses.replace(m, verify_ok=False, verify_mismatches=3)
    assert verdicts(m)["canonical_bytes"] == Verdict.FAIL
    m = dataclasses.replace(m, verify_ok=None, verify_mismatches=None)
    assert verdicts(m)["canonical_bytes"] == Verdict.UNKNOWN
    m = dataclasses.replace(m, verify_ok=True, verify_mismatches=0, registration_digest="e" * 64)
    assert verdicts(m)["registration_identity"] == Verdict.FAIL


def test_bounded_restore_pure_function_edges() -> None:
    assert acc.bounded_restore(4, 4 * C, 4 * C).verdict == Verdict.PASS
    assert acc.bounded_restore(0, 16 * C, 0).verdict == Verdict.UNKNOWN
    assert acc.bounded_restore(None, 4 * C, 4 * C).verdict == Verdict.UNKNOWN
    assert acc.bounded_restore(4, 4 * C + 100, 4 * C + 100).verdict == Verdict.PASS  # aux


def test_a_seeded_point_checks_the_seed_first() -> None:
    checks = acc.judge(serving_measures(seed_chunks_expected=16, seed_chunks_held=16))
    assert [c.name for c in checks][:2] == ["setup_seeded", "cached_token_accounting"]
    assert len(checks) == 8 and {c.verdict for c in checks} == {Verdict.PASS}
    assert checks[0].detail == "setup: fs held 16/16 whole chunks of the prompt"


@pytest.mark.parametrize("held", [0, 15, None])
def test_a_prefix_short_in_its_tier_is_unknown_and_judged_on_nothing_else(held) -> None:
    # the restore then misses: its checks would FAIL and blame the code under test
    m = serving_measures(seed_chunks_expected=16, seed_chunks_held=held, cached_tokens=0)
    (c,) = acc.judge(m)
    assert (c.name, c.verdict) == ("setup_seeded", Verdict.UNKNOWN)
    # what the tier held unmeasured is missing evidence, never a measured 0
    want = (
        "setup: what fs held was not measured"
        if held is None
        else (f"setup: fs held {held}/16 whole chunks of the prompt")
    )
    assert c.detail == want


def test_measures_read_back_from_evidence_refuse_a_renamed_key() -> None:
    m = serving_measures(seed_chunks_expected=16, seed_chunks_held=16)
    doc = m.to_json()
    assert measures_from_json(doc) == m
    doc["restore_pool_peak"] = doc.pop("restore_pool_peak_bytes")  # renamed on one side
    with pytest.raises(ValueError, match=r"unknown restore measure\(s\) \['restore_pool_peak'\]"):
        measures_from_json(doc)
