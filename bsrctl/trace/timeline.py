"""Spans to a per-request timeline: Chrome trace events (timeline.json, which Perfetto and
chrome://tracing open) and the critical path of a request's TTFT.

A span belongs to a request when one of its attributes carries the id bsrctl's client sent
(``X-Request-Id``: vLLM names the request ``cmpl-<id>-0``, its internal id and LMCache's
session add a suffix), or when it shares a trace with such a span (the client's
``traceparent`` makes vLLM's ``llm_request`` a child of the client's span). vLLM's
``llm_request`` (vllm/v1/engine/output_processor.py:877-934) carries its queue and prefill
times as attributes only: they become two derived spans ending at its first token."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

REQUEST_ID = re.compile(r"bsrq-[0-9a-f]{16}")
CLIENT = "bsrctl"  # the service of bsrctl's own process
CLIENT_REQUEST, CLIENT_TTFT = "client.request", "client.ttft"
# vLLM's SpanAttributes (vllm/tracing/utils.py:31-42)
TTFT_ATTR = "gen_ai.latency.time_to_first_token"
QUEUE_ATTR = "gen_ai.latency.time_in_queue"
PREFILL_ATTR = "gen_ai.latency.time_in_model_prefill"


@dataclass(frozen=True)
class Span:
    name: str
    service: str
    start_ns: int
    end_ns: int
    span_id: str = ""
    trace_id: str = ""
    parent: str = ""
    request: str | None = None
    pid: int | None = None
    attributes: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


def _request_in(attrs: dict[str, Any]) -> str | None:
    for value in attrs.values():
        if isinstance(value, str) and (m := REQUEST_ID.search(value)):
            return m.group(0)
    return None


def _derived(s: Span) -> list[Span]:
    """vLLM's queue and prefill of an ``llm_request`` span, from its attributes."""
    a = s.attributes
    if s.service != "vllm" or s.name != "llm_request" or TTFT_ATTR not in a:
        return []
    first = s.start_ns + round(float(a[TTFT_ATTR]) * 1e9)
    prefill_from = first - round(float(a.get(PREFILL_ATTR, 0.0)) * 1e9)
    queue_from = prefill_from - round(float(a.get(QUEUE_ATTR, 0.0)) * 1e9)
    common = {"service": s.service, "trace_id": s.trace_id, "parent": s.span_id}
    return [
        Span("vllm.queue", start_ns=queue_from, end_ns=prefill_from, request=s.request,
             pid=s.pid, attributes={"derived_from": "llm_request"}, **common),
        Span("vllm.prefill", start_ns=prefill_from, end_ns=first, request=s.request,
             pid=s.pid, attributes={"derived_from": "llm_request"}, **common),
    ]  # fmt: skip


def spans_of(records: Iterable[dict[str, Any]]) -> list[Span]:
    """The receiver's records as spans, each with its request, plus vLLM's derived ones."""
    raw = [
        Span(
            name=r["name"],
            service=r["service"],
            start_ns=int(r["start_ns"]),
            end_ns=int(r["end_ns"]),
            span_id=r.get("span_id", ""),
            trace_id=r.get("trace_id", ""),
            parent=r.get("parent_span_id", ""),
            request=_request_in(r.get("attributes") or {}),
            pid=r.get("pid"),
            attributes=dict(r.get("attributes") or {}),
        )
        for r in records
    ]
    by_trace = {s.trace_id: s.request for s in raw if s.request and s.trace_id}
    out: list[Span] = []
    for s in raw:
        if s.request is None and s.trace_id in by_trace:
            s = Span(**{**s.__dict__, "request": by_trace[s.trace_id]})
        out += [s, *_derived(s)]
    return sorted(out, key=lambda s: (s.start_ns, s.end_ns, s.service, s.name, s.span_id))


# ---- Chrome trace events ----------------------------------------------------------------


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def chrome_trace(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Trace-event JSON: a process (pid) per service, a thread (tid) per request (the same
    tid in every service; 0: no request), complete events ("X") with ts/dur in µs from the
    first span, names in metadata events ("M")."""
    spans = spans_of(records)
    if not spans:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = min(s.start_ns for s in spans)
    services = sorted({s.service for s in spans})
    pids = {name: i + 1 for i, name in enumerate(services)}
    order: list[str] = []
    for s in spans:
        if s.request and s.request not in order:
            order.append(s.request)
    tids = {rid: i + 1 for i, rid in enumerate(order)}
    events: list[dict[str, Any]] = []
    for name in services:
        events.append(
            {"name": "process_name", "ph": "M", "pid": pids[name], "tid": 0,
             "args": {"name": name}}
        )  # fmt: skip
    threads = sorted({(pids[s.service], tids.get(s.request or "", 0)) for s in spans})
    names = {v: k for k, v in tids.items()}
    for pid, tid in threads:
        events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
             "args": {"name": names.get(tid, "no request")}}
        )  # fmt: skip
    for s in spans:
        args = {k: v for k, v in s.attributes.items() if isinstance(v, str | int | float | bool)}
        if s.request:
            args["request"] = s.request
        events.append(
            {
                "name": s.name,
                "cat": s.service,
                "ph": "X",
                "ts": _us(s.start_ns - t0),
                "dur": _us(max(0, s.dur_ns)),
                "pid": pids[s.service],
                "tid": tids.get(s.request or "", 0),
                "args": args,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"t0_unix_ns": t0}}


# ---- the critical path ------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    name: str  # the span's name, or "<enclosing> (rest)" / "untraced" for a gap
    service: str  # "" for a gap no span covers
    start_ns: int
    end_ns: int
    gap: bool = False

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass(frozen=True)
class CriticalPath:
    request: str
    start_ns: int  # client send
    end_ns: int  # first token
    phases: tuple[Phase, ...]  # back to back: their durations sum to the TTFT

    @property
    def ttft_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def by_request(spans: Sequence[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        if s.request:
            out.setdefault(s.request, []).append(s)
    return out


def _window(spans: Sequence[Span]) -> tuple[int, int] | None:
    """(client send, first token): the client's TTFT span (streamed); else its request span,
    ended at vLLM's first token when vLLM reported one inside it."""
    ttft = [s for s in spans if s.service == CLIENT and s.name == CLIENT_TTFT]
    if ttft:
        return ttft[0].start_ns, ttft[0].end_ns
    req = [s for s in spans if s.service == CLIENT and s.name == CLIENT_REQUEST]
    if not req:
        return None
    a, b = req[0].start_ns, req[0].end_ns
    firsts = [s.end_ns for s in spans if s.name == "vllm.prefill" and a <= s.end_ns <= b]
    return a, (firsts[0] if firsts else b)


def _inside(t: Span, s: Span) -> bool:
    """t lies within s and is not s's interval itself."""
    return s.start_ns <= t.start_ns and t.end_ns <= s.end_ns and t.dur_ns < s.dur_ns


def critical_path(spans: Sequence[Span], request: str) -> CriticalPath | None:
    """The longest chain of non-overlapping spans from client send to first token, over
    the finest spans (one that contains another gives way to it); the time between them is
    named for the narrowest span that covers it (``"<span> (rest)"``), else ``untraced``.
    None when the request has no client span."""
    mine = [s for s in spans if s.request == request]
    win = _window(mine)
    if win is None:
        return None
    a, b = win
    within = [
        s
        for s in mine
        if a <= s.start_ns and s.end_ns <= b and s.dur_ns > 0
        and not (s.service == CLIENT and s.name in (CLIENT_REQUEST, CLIENT_TTFT))
    ]  # fmt: skip
    finest = [s for s in within if not any(_inside(t, s) for t in within)]
    chain = _longest_chain(finest)
    phases: list[Phase] = []
    at = a
    for s in [*chain, None]:
        until = b if s is None else s.start_ns
        if until > at:
            phases.append(_gap(within, at, until))
        if s is not None:
            phases.append(Phase(s.name, s.service, s.start_ns, s.end_ns))
            at = s.end_ns
    return CriticalPath(request, a, b, tuple(phases))


def _longest_chain(spans: Sequence[Span]) -> list[Span]:
    """Weighted interval scheduling: non-overlapping spans (touching is fine) of the
    greatest total duration; ties keep the chain found first (earliest ends)."""
    order = sorted(spans, key=lambda s: (s.end_ns, s.start_ns, s.service, s.name, s.span_id))
    ends = [s.end_ns for s in order]
    best = [0] * (len(order) + 1)
    take = [False] * len(order)
    prev = [0] * len(order)
    for j, s in enumerate(order):
        prev[j] = bisect.bisect_right(ends, s.start_ns, 0, j)
        with_it = s.dur_ns + best[prev[j]]
        take[j] = with_it > best[j]
        best[j + 1] = with_it if take[j] else best[j]
    chain: list[Span] = []
    j = len(order) - 1
    while j >= 0:
        if take[j]:
            chain.append(order[j])
            j = prev[j] - 1
        else:
            j -= 1
    return chain[::-1]


def _gap(within: Sequence[Span], a: int, b: int) -> Phase:
    cover = [s for s in within if s.start_ns <= a and b <= s.end_ns]
    if not cover:
        return Phase("untraced", "", a, b, gap=True)
    s = min(cover, key=lambda s: (s.dur_ns, s.service, s.name))
    return Phase(f"{s.name} (rest)", s.service, a, b, gap=True)


def phase_totals(paths: Sequence[CriticalPath]) -> dict[str, float]:
    """Milliseconds per phase summed over these requests' critical paths, largest first; a
    span's ``(rest)`` counts as the span's own time (``untraced`` stays its own)."""
    out: dict[str, float] = {}
    for path in paths:
        for ph in path.phases:
            name = ph.name.removesuffix(" (rest)")
            out[name] = out.get(name, 0.0) + ph.ms
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def slowest(spans: Sequence[Span], n: int = 3) -> list[CriticalPath]:
    """The ``n`` requests with the longest TTFT (ties: by request id)."""
    paths = [p for rid in by_request(spans) if (p := critical_path(spans, rid)) is not None]
    return sorted(paths, key=lambda p: (-p.end_ns + p.start_ns, p.request))[:n]


def render(path: CriticalPath) -> str:
    """Where the request's TTFT went, phase by phase."""
    lines = [f"request {path.request}: TTFT {path.ttft_ms:.3f} ms (client send -> first token)"]
    lines.append(f"  {'ms':>10}  {'share':>6}  phase")
    total = max(path.end_ns - path.start_ns, 1)
    for p in path.phases:
        where = f" [{p.service}]" if p.service else ""
        share = 100 * (p.end_ns - p.start_ns) / total
        lines.append(f"  {p.ms:>10.3f}  {share:>5.1f}%  {p.name}{where}")
    return "\n".join(lines)
