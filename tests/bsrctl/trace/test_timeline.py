"""A recorded set of spans -> the exact Chrome trace events and the exact critical path."""

from __future__ import annotations

import json

from bsrctl.trace.timeline import (
    chrome_trace,
    critical_path,
    phase_totals,
    render,
    slowest,
    spans_of,
)

R = "bsrq-00000000000000aa"
T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def _rec(name, service, a_ms, b_ms, attrs=None, trace="t1", sid="", parent=""):
    return {
        "name": name, "service": service, "start_ns": T0 + a_ms * MS, "end_ns": T0 + b_ms * MS,
        "attributes": attrs or {}, "trace_id": trace, "span_id": sid or name,
        "parent_span_id": parent, "pid": 7,
    }  # fmt: skip


RECORDED = [
    _rec("client.request", "bsrctl", 0, 100, {"request_id": R}),
    _rec(
        "llm_request",
        "vllm",
        2,
        150,
        {
            "gen_ai.request.id": f"cmpl-{R}-0",
            "gen_ai.latency.time_to_first_token": 0.05,
            "gen_ai.latency.time_in_model_prefill": 0.04,
            "gen_ai.latency.time_in_queue": 0.005,
        },
        parent="client.request",
    ),  # fmt: skip
    _rec("bsr.restore", "bsrkv.server", 15, 45, {"request_id": f"cmpl-{R}-0-abcd1234"}, "t2"),
    _rec("bsr.fetch", "bsrkv.server", 15, 30, {"request_id": f"cmpl-{R}-0-abcd1234"}, "t3"),
    _rec("bsr.install", "bsrkv.server", 30, 40, {"request_id": f"cmpl-{R}-0-abcd1234"}, "t4"),
    _rec("bsr.sync", "bsrkv.server", 40, 45, {"request_id": f"cmpl-{R}-0-abcd1234"}, "t5"),
    _rec("mp.lookup_prefetch", "lmcache", 1, 3, {"session_id": "x"}, "t6"),  # no request
]


def test_chrome_events_exact() -> None:
    doc = chrome_trace(RECORDED)
    json.dumps(doc)  # serialisable as is
    ev = doc["traceEvents"]
    meta = [(e["name"], e["pid"], e["tid"], e["args"]["name"]) for e in ev if e["ph"] == "M"]
    assert meta == [
        ("process_name", 1, 0, "bsrctl"),
        ("process_name", 2, 0, "bsrkv.server"),
        ("process_name", 3, 0, "lmcache"),
        ("process_name", 4, 0, "vllm"),
        ("thread_name", 1, 1, R),
        ("thread_name", 2, 1, R),
        ("thread_name", 3, 0, "no request"),
        ("thread_name", 4, 1, R),
    ]
    xs = [(e["name"], e["pid"], e["tid"], e["ts"], e["dur"]) for e in ev if e["ph"] == "X"]
    assert xs == [
        ("client.request", 1, 1, 0.0, 100000.0),
        ("mp.lookup_prefetch", 3, 0, 1000.0, 2000.0),
        ("llm_request", 4, 1, 2000.0, 148000.0),
        ("vllm.queue", 4, 1, 7000.0, 5000.0),
        ("vllm.prefill", 4, 1, 12000.0, 40000.0),
        ("bsr.fetch", 2, 1, 15000.0, 15000.0),
        ("bsr.restore", 2, 1, 15000.0, 30000.0),
        ("bsr.install", 2, 1, 30000.0, 10000.0),
        ("bsr.sync", 2, 1, 40000.0, 5000.0),
    ]
    assert doc["otherData"] == {"t0_unix_ns": T0}
    assert doc["displayTimeUnit"] == "ms"


def test_events_have_the_trace_event_formats_required_keys() -> None:
    # Trace Event Format: complete events need name, ph, ts, dur, pid, tid (µs numbers);
    # metadata events name, ph "M", pid, args.name
    for e in chrome_trace(RECORDED)["traceEvents"]:
        if e["ph"] == "X":
            assert {"name", "ph", "ts", "dur", "pid", "tid"} <= e.keys()
            assert isinstance(e["ts"], float) and e["dur"] >= 0
            assert all(isinstance(e[k], int) for k in ("pid", "tid"))
        else:
            assert e["ph"] == "M" and e["name"] in ("process_name", "thread_name")
            assert isinstance(e["args"]["name"], str)


def test_critical_path_exact() -> None:
    path = critical_path(spans_of(RECORDED), R)
    assert path is not None
    got = [(p.name, p.service, p.ms, p.gap) for p in path.phases]
    assert got == [
        ("untraced", "", 7.0, True),
        ("vllm.queue", "vllm", 5.0, False),
        ("vllm.prefill (rest)", "vllm", 3.0, True),
        ("bsr.fetch", "bsrkv.server", 15.0, False),
        ("bsr.install", "bsrkv.server", 10.0, False),
        ("bsr.sync", "bsrkv.server", 5.0, False),
        ("vllm.prefill (rest)", "vllm", 7.0, True),
    ]
    assert path.ttft_ms == 52.0 == sum(p.ms for p in path.phases)
    assert render(path).splitlines()[:3] == [
        f"request {R}: TTFT 52.000 ms (client send -> first token)",
        "          ms   share  phase",
        "       7.000   13.5%  untraced",
    ]


def test_streamed_ttft_span_bounds_the_path_and_overlaps_pick_the_longest_chain() -> None:
    recs = [
        _rec("client.request", "bsrctl", 0, 50, {"request_id": R}),
        _rec("client.ttft", "bsrctl", 0, 20, {"request_id": R}),
        _rec("a", "x", 0, 10, {"request_id": R}),
        _rec("b", "x", 5, 20, {"request_id": R}),  # holds c: gives way to it
        _rec("c", "x", 12, 20, {"request_id": R}),
        _rec("d", "x", 9, 11, {"request_id": R}),  # overlaps a and the gap: a (10) wins
        _rec("e", "x", 30, 40, {"request_id": R}),  # after the first token: not on the path
    ]
    path = critical_path(spans_of(recs), R)
    assert path is not None
    assert [(p.name, p.ms) for p in path.phases] == [("a", 10.0), ("b (rest)", 2.0), ("c", 8.0)]
    assert [p.request for p in slowest(spans_of(recs))] == [R]


def test_report_draws_the_slowest_requests_timelines(tmp_path) -> None:
    from bsrctl.report.timeline_figure import timeline_plots

    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDED))
    doc = {"run_id": "r", "kind": "sweep", "stack": {"kind": "serving"}, "versions": {}}
    (plot,) = timeline_plots(tmp_path, doc)
    assert plot.name == "timeline" and plot.svg.startswith("<svg")
    assert R in plot.svg and "bsr.fetch" in plot.svg


def test_phase_totals_sum_each_phase_over_requests_rest_counted_as_its_span() -> None:
    path = critical_path(spans_of(RECORDED), R)
    assert path is not None
    assert phase_totals([path, path]) == {
        "bsr.fetch": 30.0, "vllm.prefill": 20.0, "bsr.install": 20.0, "untraced": 14.0,
        "bsr.sync": 10.0, "vllm.queue": 10.0,
    }  # fmt: skip
    assert list(phase_totals([path])) == [
        "bsr.fetch", "bsr.install", "vllm.prefill", "untraced", "bsr.sync", "vllm.queue"
    ]  # largest first, ties by name  # fmt: skip
    assert phase_totals([]) == {}
