"""The report's "slowest requests" figure of a restore run shows its measured restores, never
the seeding prefills that stored the prefix first (they are the slowest: a whole prefill)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bsrctl.report.timeline_figure import timeline_plots
from bsrctl.trace.restores import measured_restores
from bsrctl.trace.timeline import spans_of

pytest.importorskip("matplotlib")
MS = 1_000_000
SEED = ["bsrq-5eed000000000001", "bsrq-5eed000000000002"]
RESTORE = ["bsrq-7e57000000000001", "bsrq-7e57000000000002", "bsrq-7e57000000000003"]
WARMUP = "bsrq-3a3a000000000001"  # a warm-up restore: measured by no point


def request(rid: str, t0: int, ms: int, inner: str) -> list[dict[str, Any]]:
    """A client request of ``ms`` milliseconds with one server span (a store or a restore)."""
    service = "lmcache" if inner == "mp.store" else "bsrkv.server"
    return [
        {"name": "client.request", "service": "bsrctl", "start_ns": t0, "end_ns": t0 + ms * MS,
         "span_id": f"{rid}-c", "trace_id": rid, "attributes": {"request_id": rid}},
        {"name": inner, "service": service, "start_ns": t0 + MS, "end_ns": t0 + (ms - 1) * MS,
         "span_id": f"{rid}-s", "trace_id": rid,
         "attributes": {"session_id": f"cmpl-{rid}-0-abcd1234"}},
    ]  # fmt: skip


def records() -> list[dict[str, Any]]:
    out = []
    out += request(SEED[0], 0, 900, "mp.store")  # seeding prefills: the slowest by far
    out += request(SEED[1], 1000 * MS, 800, "mp.store")
    out += request(RESTORE[0], 2000 * MS, 40, "bsr.restore")
    out += request(RESTORE[1], 3000 * MS, 60, "bsr.stock_retrieve")
    out += request(RESTORE[2], 4000 * MS, 20, "bsr.restore")
    out += request(WARMUP, 5000 * MS, 99, "bsr.restore")
    return out


def doc(named: bool, kind: str = "sweep") -> dict[str, Any]:
    ids = {"request_ids": RESTORE} if named else {}
    point = {"id": "n2048-w4", "params": {}, "measures": {}, "checks": [], "verdict": "PASS"}
    return {"run_id": "br-e1-0123456789ab", "kind": kind, "stack": {}, "points": [{**point, **ids}]}


def test_the_points_request_ids_are_the_restores_shown() -> None:
    spans = spans_of(records())
    shown = measured_restores(doc(named=True), spans)
    assert shown is not None
    assert sorted({s.request for s in shown}) == sorted(RESTORE)  # no seeding, no warm-up


def test_older_evidence_shows_requests_that_restored_and_stored_nothing() -> None:
    shown = measured_restores(doc(named=False), spans_of(records()))
    assert shown is not None
    assert sorted({s.request for s in shown}) == sorted([*RESTORE, WARMUP])


def test_a_run_that_is_not_a_restore_run_shows_every_request() -> None:
    assert measured_restores(doc(named=False, kind="tempokv"), spans_of(records())) is None


def test_the_figure_ranks_the_slowest_measured_restores(tmp_path: Path) -> None:
    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records()))
    (plot,) = timeline_plots(tmp_path, doc(named=True))
    assert plot.title == "Slowest measured restores' timelines (critical path)"
    assert "Slowest 3 measured restore(s): where the TTFT went" in plot.svg
    labels = [rid for rid in [*SEED, *RESTORE, WARMUP] if rid in plot.svg]
    assert labels == RESTORE
    at = {rid: plot.svg.index(rid) for rid in RESTORE}
    assert sorted(at, key=at.__getitem__) == [RESTORE[1], RESTORE[0], RESTORE[2]]  # slowest first
