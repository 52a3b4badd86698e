"""Extensions fail loudly: the ``extensions_healthy`` check.

Every bsrkv part inside a host process (vLLM's scheduler adapter, LMCache's server module,
its L2 adapters, the fault pump, TempoKV's loop, the spans) runs under a guard
(``bsrkv.hostguard``) that turns an exception into the host's stock behaviour and counts it
by (guard, site, exception type). The engine keeps serving; the verdict must not pretend it
measured the extension. Each process reports its cumulative counts (LMCache: ``bsr.status``
``guard_failures``; vLLM: the step trace's ``guards`` records); an experiment reads them
before and after each cell (``GuardDelta.over``) and judges the cell with
``extensions_healthy``: any failure FAILs naming the process, guard, site, exception type and
count; counts that could not be read are UNKNOWN, never PASS. Pure: the readers live with
the stack (``bsrctl.stack.contracts.guards``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bsrctl.evidence.verdict import Check, Point, check

NAME = "extensions_healthy"
Key = tuple[str, str, str]  # guard, site, exception type


@dataclass(frozen=True)
class GuardCounts:
    """One process's cumulative guard failures as read once."""

    counts: Mapping[Key, int]

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> GuardCounts:
        """From the wire's rows ``{"guard", "site", "type", "count"}``."""
        return cls({(str(r["guard"]), str(r["site"]), str(r["type"])): int(r["count"])
                    for r in rows})  # fmt: skip


Read = GuardCounts | str  # the counts, or why they could not be read


@dataclass(frozen=True)
class GuardDelta:
    """What one process's guards counted over a cell. ``failures`` None: not read (``note``
    says why); else ``note`` says how the baseline was taken when it was not the cell's
    start."""

    source: str  # "LMCache server" | "vLLM engine"
    failures: Mapping[Key, int] | None
    note: str = ""

    @classmethod
    def over(cls, source: str, before: Read, after: Read, restarted: bool = False) -> GuardDelta:
        """The failures between two reads. A process that restarted in between (said, or
        seen as a count that went down) counts from its restart; a baseline that could not
        be read counts from the process's start (never fewer failures than happened)."""
        if isinstance(after, str):
            return cls(source, None, after)
        base: Mapping[Key, int] = {}
        note = ""
        if isinstance(before, str):
            note = f"baseline not read ({before}): counted since the process started"
        elif restarted or any(after.counts.get(k, 0) < n for k, n in before.counts.items()):
            note = "restarted in the cell: counted since its restart"
        else:
            base = before.counts
        moved = {k: n - base.get(k, 0) for k, n in after.counts.items()}
        return cls(source, {k: n for k, n in sorted(moved.items()) if n > 0}, note)

    def to_json(self) -> dict[str, Any]:
        rows = None if self.failures is None else [
            {"guard": g, "site": s, "type": t, "count": n}
            for (g, s, t), n in self.failures.items()
        ]  # fmt: skip
        return {"source": self.source, "failures": rows, "note": self.note}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> GuardDelta:
        rows = raw["failures"]
        failures = None if rows is None else GuardCounts.from_rows(rows).counts
        return cls(str(raw["source"]), failures, str(raw.get("note", "")))


def describe(source: str, key: Key, count: int) -> str:
    """One failing site as the check names it."""
    guard, site, kind = key
    return f"{source}: {guard} [{site}] {kind} x{count}"


def extensions_healthy(deltas: Sequence[GuardDelta]) -> Check:
    """FAIL naming every site that failed over the cell; else UNKNOWN when a process's
    counts were not read (or none was); else PASS."""
    if not deltas:
        return check(NAME, None, "no process's guard failures were read")
    failed = [describe(d.source, k, n) for d in deltas for k, n in (d.failures or {}).items()]
    unread = [f"{d.source} ({d.note})" for d in deltas if d.failures is None]
    notes = [f"{d.source} {d.note}" for d in deltas if d.failures is not None and d.note]
    tail = "".join(f"; {n}" for n in notes)
    if failed:
        missing = f"; not read: {', '.join(unread)}" if unread else ""
        return check(NAME, False, "extension degraded to stock: " + "; ".join(failed)
                     + missing + tail)  # fmt: skip
    if unread:
        return check(NAME, None, f"guard failures not read: {', '.join(unread)}{tail}")
    sources = ", ".join(d.source for d in deltas)
    return check(NAME, True, f"no guard failure in {sources}{tail}")


def judge_json(raw: Sequence[Mapping[str, Any]] | None) -> Check:
    """The check from deltas as the evidence keeps them (None: never read)."""
    if raw is None:
        return check(NAME, None, "guard failures not read at this point")
    return extensions_healthy([GuardDelta.from_json(d) for d in raw])


def with_guards(point: Point, deltas: Sequence[Mapping[str, Any]] | None) -> Point:
    """``point`` judged on its guard failures too: the deltas in its measures (``guards``)
    and ``extensions_healthy`` after its own checks."""
    measures = {**point.measures, "guards": None if deltas is None else list(deltas)}
    return replace(point, measures=measures, checks=(*point.checks, judge_json(deltas)))
