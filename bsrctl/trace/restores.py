"""Which requests of a run are its measured restores: the requests its points name
(``request_ids``), never the seeding prefills that store the prefix first (they compute the
whole prompt and would always be the slowest). Evidence from before points named them: the
requests whose spans show a restore (the server module's, W > 0 or the whole plan) and no
store. Both ``bsrctl timeline`` and report.html's timeline figure rank these."""

from __future__ import annotations

from typing import Any

from bsrctl.trace.timeline import Span, by_request

RESTORE_KINDS = ("sweep", "law", "ladder")
RESTORE_SPANS = ("bsr.restore", "bsr.stock_retrieve")  # the server module's, W > 0 and W = 0
STORE_SPANS = ("mp.store",)  # LMCache storing what vLLM computed: a seeding prefill


def measured_restores(doc: dict[str, Any], spans: list[Span]) -> list[Span] | None:
    """The spans of the run's measured restores; None for a run that is not a restore run
    (every request is shown)."""
    named = {rid for p in doc.get("points", []) for rid in p.get("request_ids") or ()}
    if not named and doc.get("kind") not in RESTORE_KINDS:
        return None
    if not named:
        for rid, mine in by_request(spans).items():
            names = {s.name for s in mine}
            if names & set(RESTORE_SPANS) and not names & set(STORE_SPANS):
                named.add(rid)
    return [s for s in spans if s.request in named]
