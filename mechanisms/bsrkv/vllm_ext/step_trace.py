"""The adapter's step trace inside vLLM: a JSON-lines file of every step's decision and
message (``BSRKV_TEMPOKV``'s ``trace_path``), kept off the engine loop's hot path and
dropped whole, never raised, when it cannot be written."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
from pathlib import Path
from typing import Any

from bsrkv.hostguard import Failure, Guard, process_failures

TRACE_BATCH = 4096  # records kept before a write while the engine stays busy
# what runs before a scheduler has its own guard (and tests' bare traces)
GUARD = Guard("bsrkv.vllm_ext", logging.getLogger("bsrkv.vllm_ext"))


class StepTrace:
    """The per-step record (the on/off test compares `scheduled` and outputs). One handle
    held open; records are kept in memory while the engine is busy and serialized and
    written together when it goes idle (``flush``: no request left), every
    ``TRACE_BATCH`` records, and at exit: the engine loop pays no JSON and no write per
    step while it serves. A run reads the trace once its requests are done (the engine
    idle: everything written). A trace that cannot be opened or written (a full disk) is
    dropped whole at its first failure, counted on the guard: the engine goes on.

    Each write also carries the engine process's guard failures (``hostguard
    .process_failures``) as a ``guards`` record, at the first write and whenever they
    changed since: what the harness reads to judge whether the adapter ran at all (a
    trace without one was never written, not "no failure")."""

    def __init__(self, path: Path | None, guard: Guard | None = None) -> None:
        self._guard = guard if guard is not None else GUARD
        self._file: Any = None
        self._pending: list[dict[str, Any]] = []
        self._guards: list[Failure] | None = None  # the failures last written
        if path is not None:
            self._file = self._guard.call("trace", path.open, "a")
            if self._file is not None:
                atexit.register(self.flush)

    def write(self, record: dict[str, Any]) -> None:
        """Keep ``record`` (a dict of its own: nothing in it changes after)."""
        if self._file is None:
            return
        self._pending.append(record)
        if len(self._pending) >= TRACE_BATCH:
            self.flush()

    def flush(self) -> None:
        f = self._file
        if f is None:
            return
        failures = process_failures()
        if failures != self._guards:
            self._guards = failures
            rows = [{"guard": g, "site": s, "type": t, "count": n} for g, s, t, n in failures]
            self._pending.append({"kind": "guards", "failures": rows})
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            f.write("".join([json.dumps(r) + "\n" for r in batch]))
            f.flush()
        except Exception as exc:
            self._file = None  # first, so the guard's own record cannot come back here
            with contextlib.suppress(Exception):  # the same failure again (its buffer)
                f.close()
            self._guard.failed("trace", exc)


def traced(payload: dict[str, Any]) -> dict[str, Any]:
    """An update as the trace keeps it: each hit's token count instead of its token ids
    (a 3072-token document's ids are about 18 KB of JSON, written on the engine loop at
    every arrival; nothing reads them back: the server has them)."""
    hits = payload.get("hits")
    if not hits:
        return payload
    slim = {rid: {**{k: v for k, v in h.items() if k != "token_ids"},
                  "tokens": len(h["token_ids"])} for rid, h in hits.items()}  # fmt: skip
    return {**payload, "hits": slim}
