"""Reading the guard failures a deployment's processes report (``bsrctl.evidence.guards``
judges them): LMCache's server from ``bsr.status`` ``guard_failures``; vLLM's engine, where
it runs bsrkv's scheduler adapter, from its step trace's last ``guards`` record (written
whenever the engine goes idle). ``GuardWatch`` reads both before a cell and after it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.evidence.guards import GuardCounts, GuardDelta, Read

LMCACHE = "LMCache server"
VLLM = "vLLM engine"


def lmcache_guards(client: Any) -> Read:
    """The LMCache server's counts, or why they could not be read."""
    if client is None:
        return "no bsr.* client"
    try:
        rows = client.status().guard_failures
    except (StackFailed, OSError) as exc:
        return f"bsr.status failed: {exc}"
    if rows is None:
        return "bsr.status has no guard_failures (a server module older than this bsrctl)"
    return GuardCounts({(r.guard, r.site, r.type): r.count for r in rows})


def vllm_guards(trace: Path) -> Read:
    """The engine's counts as of its last ``guards`` record, or why there is none."""
    try:
        lines = trace.read_text().splitlines()
    except OSError as exc:
        return f"step trace {trace} not read: {exc.strerror or exc}"
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a record cut by a write in progress: an earlier one is whole
        if isinstance(rec, dict) and rec.get("kind") == "guards":
            return GuardCounts.from_rows(rec["failures"])
    return f"step trace {trace} holds no guards record (the trace was never written)"


@dataclass
class GuardWatch:
    """Reads before a cell and after it, for each process that reports: LMCache (through
    ``client``) and, when ``trace`` is set, vLLM's engine."""

    trace: Path | None = None
    _before: dict[str, Read] = field(default_factory=dict)

    def _read(self, client: Any) -> dict[str, Read]:
        out = {LMCACHE: lmcache_guards(client)}
        if self.trace is not None:
            out[VLLM] = vllm_guards(self.trace)
        return out

    def start(self, client: Any) -> None:
        self._before = self._read(client)

    def end(self, client: Any, restarted: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """The deltas since ``start`` as the evidence keeps them (``judge_json``);
        ``restarted``: the sources whose process was replaced in the cell."""
        after = self._read(client)
        missing = "not read before the cell"
        return [
            GuardDelta.over(s, self._before.get(s, missing), a, s in restarted).to_json()
            for s, a in after.items()
        ]
