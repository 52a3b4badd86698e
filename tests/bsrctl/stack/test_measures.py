"""A point's measures per target: the common fields and each target's own, one flat JSON with
its target, read back as the same type; evidence from before the split reads as its target."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bsrctl.experiments.restore import repeats
from bsrctl.stack.contracts.measures import (
    BY_STACK_KIND,
    RestoreMeasures,
    SeedRecord,
    ServingMeasures,
    StorageMeasures,
    measures_from_json,
    names,
    own_names,
)

C = 262_144
SEED = SeedRecord("fs", 16, 16, ({"cached_tokens": 0, "held_chunks": 16},), 0.25)


def serving(**over: Any) -> ServingMeasures:
    m = {
        "tokens": 4096, "window_chunks": 4, "l1_capacity_bytes": 64 * C,
        "restore_pool_peak_bytes": 4 * C, "cached_tokens": 4095, "external_hit_tokens": 4095,
        "output_sha256": "a" * 64, "restore_modes": ("bsr",), "ttft_s": 0.12, "seed": SEED,
        "registration_tensors_live": ("kv=[2, 16] bfloat16 g0",),
    }  # fmt: skip
    return ServingMeasures(**{**m, **over})


def storage(**over: Any) -> StorageMeasures:
    m = {
        "tokens": 4096, "window_chunks": 4, "l1_capacity_bytes": 8 * C,
        "restore_pool_peak_bytes": 4 * C, "l1_peak_bytes_by_rank": {"0": 4 * C},
        "verify_ok": True, "verify_mismatches": 0, "probe_s": 0.001, "restore_s": 0.05,
    }  # fmt: skip
    return StorageMeasures(**{**m, **over})


def test_the_split_leaves_no_field_on_both_targets_and_loses_none() -> None:
    common = names(RestoreMeasures)
    srv, sto = own_names(ServingMeasures), own_names(StorageMeasures)
    assert not srv & sto and not (srv | sto) & common
    # what the one class held before the split: 58 fields, every one kept on a type; since,
    # serving's guard reads (1 field), storage's byte check and tier integrity (5 fields)
    assert (len(common), len(srv), len(sto)) == (23, 18, 23)
    assert {"output_sha256", "readback", "seed", "ttft_s", "external_hit_tokens"} <= srv
    assert {"verify_ok", "l1_peak_bytes_by_rank", "probe_s", "budget_chunks"} <= sto
    assert BY_STACK_KIND == {
        "serving": ServingMeasures, "storage": StorageMeasures, "attach": ServingMeasures,
    }  # fmt: skip


@pytest.mark.parametrize("m", [serving(), storage()], ids=["serving", "storage"])
def test_each_type_round_trips_flat_with_its_target(m: RestoreMeasures) -> None:
    doc = m.to_json()
    assert next(iter(doc)) == "target" and doc["target"] == type(m).target
    assert set(doc) == {"target"} | names(type(m))
    back = measures_from_json(doc)
    assert type(back) is type(m) and back == m


def test_storage_s_byte_check_and_tier_integrity_round_trip_as_tuples() -> None:
    m = storage(
        mismatched_objects=("a.data",),
        tier_rejected_objects=("b.data", "c.data"),
        bytes_checked="after_timer",
        bytes_check_s=0.002,
        tier_integrity="none",
    )
    doc = json.loads(json.dumps(m.to_json()))
    assert doc["tier_rejected_objects"] == ["b.data", "c.data"]
    assert measures_from_json(doc) == m


def test_a_key_of_the_other_target_or_an_unknown_target_is_refused() -> None:
    doc = storage().to_json()
    doc["output_sha256"] = None  # a serving measure on a storage point, even null
    with pytest.raises(ValueError, match=r"unknown restore measure\(s\) \['output_sha256'\] \(tar"):
        measures_from_json(doc)
    with pytest.raises(ValueError, match=r"target 'sim': known \['serving', 'storage'\]"):
        measures_from_json({**serving().to_json(), "target": "sim"})


# Storage measures added after the split (the byte check, tier integrity): not in legacy docs.
SINCE_SPLIT = frozenset({"mismatched_objects", "tier_rejected_objects", "bytes_checked",
                         "bytes_check_s", "tier_integrity"})  # fmt: skip


def _legacy(m: RestoreMeasures) -> dict[str, Any]:
    """As evidence was written before the split: every field of both targets, no target."""
    doc = {k: None for k in (names(ServingMeasures) | names(StorageMeasures)) - SINCE_SPLIT}
    doc["health_detail"] = ""
    doc.update({k: v for k, v in m.to_json().items() if k not in SINCE_SPLIT | {"target"}})
    return doc


@pytest.mark.parametrize("m", [serving(), storage()], ids=["serving", "storage"])
def test_evidence_from_before_the_split_reads_as_its_target(m: RestoreMeasures) -> None:
    doc = _legacy(m)
    assert len(doc) == 59 and "target" not in doc
    assert measures_from_json(doc) == m


def test_legacy_evidence_that_measured_nothing_target_only_reads_as_serving() -> None:
    # a ladder rung whose stack failed first: only the common fields hold anything
    m = serving(output_sha256=None, external_hit_tokens=None, restore_modes=None, ttft_s=None,
                seed=None)  # fmt: skip
    assert measures_from_json(_legacy(m)) == m


def test_legacy_evidence_holding_both_targets_or_an_unknown_key_is_refused() -> None:
    doc = _legacy(storage())
    doc["ttft_s"] = 0.2
    with pytest.raises(ValueError, match=r"serving \['ttft_s'\], storage \['l1_peak_bytes_by_r"):
        measures_from_json(doc)
    doc = _legacy(storage())
    doc["restore_pool_peak"] = 1
    with pytest.raises(ValueError, match=r"\['restore_pool_peak'\] \(no target\)"):
        measures_from_json(doc)


def test_repeats_sample_and_compare_each_targets_own_measures() -> None:
    assert repeats.TIMED == {
        ServingMeasures: ("ttft_s", "restore_s", "retrieve_s"),
        StorageMeasures: ("restore_s", "probe_s", "retrieve_s"),
    }
    for cls, fields in repeats.TIMED.items():
        assert set(fields) <= names(cls)
    for cls, fields in repeats.IDENTICAL.items():
        assert set(fields) <= names(cls)
    assert repeats.timed_samples([storage(), storage(restore_s=0.07)]) == {
        "restore_s": [0.05, 0.07], "probe_s": [0.001, 0.001],
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"of one target, got \['ServingMeasures', 'StorageMe"):
        repeats.timed_samples([storage(), serving()])


_maybe_int = st.none() | st.integers(min_value=0, max_value=1 << 40)
_maybe_text = st.none() | st.text(max_size=8)


@given(
    target=st.sampled_from([serving, storage]),
    peak=_maybe_int,
    cached=_maybe_int,
    tier=st.none() | st.sampled_from(["fs", "mooncake"]),
    healthy=st.none() | st.booleans(),
    detail=st.text(max_size=16),
    error=_maybe_text,
    restore_s=st.none() | st.floats(min_value=0, max_value=1e3, allow_nan=False),
)
def test_reading_back_what_was_written_is_the_identity(
    target: Any, peak: Any, cached: Any, tier: Any, healthy: Any, detail: str, error: Any,
    restore_s: Any,
) -> None:  # fmt: skip
    m = target(
        restore_pool_peak_bytes=peak, cached_tokens=cached, tier=tier, healthy=healthy,
        health_detail=detail, error=error, restore_s=restore_s,
    )  # fmt: skip
    assert measures_from_json(m.to_json()) == m
    assert measures_from_json(_legacy(m)) == m
