"""``extensions_healthy``: the guard failures a deployment's processes report, read before
and after a cell, judged with the site, the exception type and the count named; counts that
could not be read are UNKNOWN, never PASS. The readers (``bsr.status``, vLLM's trace) and the
process-wide counts they read (``bsrkv.hostguard``)."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bsrctl.errors import StackFailed
from bsrctl.evidence.guards import (
    GuardCounts,
    GuardDelta,
    extensions_healthy,
    judge_json,
    with_guards,
)
from bsrctl.evidence.verdict import Point, Verdict, check
from bsrctl.stack.contracts.guards import LMCACHE, VLLM, GuardWatch, lmcache_guards, vllm_guards
from bsrkv.hostguard import Guard, process_failures
from bsrkv.lmcache_ext.bsr.protocol import GuardFailure

SERVER = "bsrkv.lmcache_ext.server"
GATE = (SERVER, "tempokv_gate", "RuntimeError")
LOOP = ("bsrkv.lmcache_ext.tempokv", "tempokv_loop", "KeyError")


def counts(**by: int) -> GuardCounts:
    keys = {"gate": GATE, "loop": LOOP}
    return GuardCounts({keys[k]: n for k, n in by.items()})


def test_a_failure_over_the_cell_fails_naming_site_type_and_count() -> None:
    d = GuardDelta.over(LMCACHE, counts(gate=2), counts(gate=5, loop=1))
    assert d.failures == {LOOP: 1, GATE: 3}
    c = extensions_healthy([d, GuardDelta.over(VLLM, GuardCounts({}), GuardCounts({}))])
    assert (c.name, c.verdict) == ("extensions_healthy", Verdict.FAIL)
    assert c.detail == (
        "extension degraded to stock: LMCache server: bsrkv.lmcache_ext.server "
        "[tempokv_gate] RuntimeError x3; LMCache server: bsrkv.lmcache_ext.tempokv "
        "[tempokv_loop] KeyError x1"
    )


def test_failures_from_before_the_cell_are_not_the_cells() -> None:
    c = extensions_healthy([GuardDelta.over(LMCACHE, counts(gate=4), counts(gate=4))])
    assert (c.verdict, c.detail) == (Verdict.PASS, "no guard failure in LMCache server")


def test_counts_not_read_are_unknown_and_a_known_failure_still_fails() -> None:
    unread = GuardDelta.over(VLLM, GuardCounts({}), "step trace t holds no guards record")
    c = extensions_healthy([GuardDelta.over(LMCACHE, counts(), counts()), unread])
    assert (c.verdict, c.detail) == (
        Verdict.UNKNOWN,
        "guard failures not read: vLLM engine (step trace t holds no guards record)",
    )
    c = extensions_healthy([GuardDelta.over(LMCACHE, counts(), counts(gate=1)), unread])
    assert c.verdict == Verdict.FAIL
    assert c.detail.endswith("; not read: vLLM engine (step trace t holds no guards record)")
    assert extensions_healthy([]).verdict == Verdict.UNKNOWN
    assert judge_json(None).detail == "guard failures not read at this point"


def test_a_restart_or_an_unread_baseline_counts_from_the_process_start() -> None:
    # the server was killed and restarted in the cell: its counts start again
    d = GuardDelta.over(LMCACHE, counts(gate=9), counts(gate=2), restarted=True)
    assert (d.failures, d.note) == ({GATE: 2}, "restarted in the cell: counted since its restart")
    assert GuardDelta.over(LMCACHE, counts(gate=9), counts(gate=2)).failures == {GATE: 2}  # seen
    d = GuardDelta.over(LMCACHE, "bsr.status failed: x", counts(loop=1))
    assert d.note == "baseline not read (bsr.status failed: x): counted since the process started"
    c = extensions_healthy([GuardDelta.over(LMCACHE, counts(gate=1), counts(), True)])
    assert (c.verdict, c.detail) == (
        Verdict.PASS,
        "no guard failure in LMCache server; LMCache server restarted in the cell: counted "
        "since its restart",
    )


KEYS = st.tuples(st.sampled_from(["g1", "g2"]), st.sampled_from(["a", "b"]),
                 st.sampled_from(["KeyError", "OSError"]))  # fmt: skip


@given(st.dictionaries(KEYS, st.integers(0, 50)), st.dictionaries(KEYS, st.integers(0, 50)))
def test_a_delta_is_what_happened_in_between_and_judges_as_it(
    base: dict[Any, int], more: dict[Any, int]
) -> None:
    after = {k: base.get(k, 0) + more.get(k, 0) for k in {*base, *more}}
    d = GuardDelta.over(LMCACHE, GuardCounts(base), GuardCounts(after))
    assert d.failures == {k: n for k, n in more.items() if n}
    assert GuardDelta.from_json(json.loads(json.dumps(d.to_json()))) == d  # as evidence keeps it
    c = extensions_healthy([d])
    assert c.verdict == (Verdict.FAIL if any(more.values()) else Verdict.PASS)
    assert c.detail.count(" x") == sum(1 for n in more.values() if n)


def test_a_point_keeps_its_deltas_and_is_judged_on_them() -> None:
    p = Point("c", {}, {"tokens": 1}, (check("canonical_output", True),))
    d = GuardDelta.over(LMCACHE, counts(), counts(gate=1)).to_json()
    got = with_guards(p, [d])
    assert got.measures == {"tokens": 1, "guards": [d]}
    assert [c.name for c in got.checks] == ["canonical_output", "extensions_healthy"]
    assert got.verdict == Verdict.FAIL


def test_the_process_counts_by_type_outlive_the_guard() -> None:
    def boom(kind: type[Exception]) -> None:
        raise kind("x")

    g = Guard("tests.guards.outlive")
    g.call("site", boom, KeyError)
    g.call("site", boom, OSError)
    g.call("site", boom, KeyError)
    del g
    gc.collect()
    mine = [f for f in process_failures() if f[0] == "tests.guards.outlive"]
    assert mine == [("tests.guards.outlive", "site", "KeyError", 2),
                    ("tests.guards.outlive", "site", "OSError", 1)]  # fmt: skip


class Status:
    def __init__(self, rows: tuple[GuardFailure, ...] | None) -> None:
        self.guard_failures = rows


class Client:
    """A bsr.* client whose status answers ``replies`` in turn (an exception: raised)."""

    def __init__(self, *replies: Any) -> None:
        self.replies = list(replies)

    def status(self) -> Status:
        got = self.replies.pop(0)
        if isinstance(got, Exception):
            raise got
        return got


def test_the_lmcache_reader_names_why_it_could_not_read() -> None:
    row = GuardFailure(SERVER, "tempokv_gate", "RuntimeError", 2)
    assert lmcache_guards(Client(Status((row,)))) == GuardCounts({GATE: 2})
    assert lmcache_guards(Client(Status(None))) == (
        "bsr.status has no guard_failures (a server module older than this bsrctl)"
    )
    assert lmcache_guards(Client(StackFailed("gone"))) == "bsr.status failed: gone"
    assert lmcache_guards(None) == "no bsr.* client"


def test_the_vllm_reader_takes_the_last_whole_guards_record(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    assert vllm_guards(trace).startswith(f"step trace {trace} not read: ")
    trace.write_text('{"kind": "step"}\n')
    assert vllm_guards(trace) == (
        f"step trace {trace} holds no guards record (the trace was never written)"
    )
    rec = {"kind": "guards", "failures": [{"guard": "bsrkv.vllm_ext", "site": "schedule",
                                           "type": "AttributeError", "count": 7}]}  # fmt: skip
    first = {"kind": "guards", "failures": []}
    trace.write_text(json.dumps(first) + "\n" + json.dumps(rec) + '\n{"kind": "gua')
    assert vllm_guards(trace) == GuardCounts({("bsrkv.vllm_ext", "schedule", "AttributeError"): 7})


def test_the_watch_reads_both_processes_before_and_after(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"kind": "guards", "failures": []}) + "\n")
    row = GuardFailure(SERVER, "tempokv_gate", "RuntimeError", 1)
    client = Client(Status(()), Status((row,)))
    watch = GuardWatch(trace)
    watch.start(client)
    got = watch.end(client)
    assert got == [
        {"source": LMCACHE, "note": "",
         "failures": [{"guard": SERVER, "site": "tempokv_gate", "type": "RuntimeError",
                       "count": 1}]},
        {"source": VLLM, "failures": [], "note": ""},
    ]  # fmt: skip
    assert judge_json(got).verdict == Verdict.FAIL


def test_reports_without_a_checks_table_list_what_did_not_pass() -> None:
    from bsrctl.report import soak
    from bsrctl.report.units import guard_lines
    from bsrctl.tempokv import report as tempokv

    bad = extensions_healthy([GuardDelta.over(LMCACHE, counts(), counts(gate=2))]).to_json()
    ok = extensions_healthy([GuardDelta.over(LMCACHE, counts(), counts())]).to_json()
    points = [
        {"id": "r0000", "params": {"prefix_tokens": 1024}, "verdict": "FAIL", "checks": [bad]},
        {"id": "r0001", "params": {"prefix_tokens": 1024}, "verdict": "FAIL", "checks": [bad]},
        {"id": "r0002", "params": {"prefix_tokens": 1024}, "verdict": "PASS", "checks": [ok]},
    ]
    want = [
        "",
        "## Extension guards",
        "",
        "- FAIL (r0000, r0001): extension degraded to stock: LMCache server: "
        "bsrkv.lmcache_ext.server [tempokv_gate] RuntimeError x2",
    ]
    assert guard_lines(points) == want
    assert guard_lines(points[2:]) == []
    doc = {"run_id": "br-x", "kind": "soak", "verdict": "FAIL", "complete": True,
           "started_at": "t0", "salt": "s", "spec_sha256": "0" * 64, "points": points,
           "summary": {}}  # fmt: skip
    assert "\n".join(want) in soak.render(doc)
    doc = {**doc, "kind": "tempokv", "summary": {"experiment": "serving-policies"}}
    assert "\n".join(want) in tempokv.render(doc)
