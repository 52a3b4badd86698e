"""The passive side of bsrkv in vLLM's scheduler: ``StepRecorder`` records each step's
decision to the step trace (the adapter-off arm runs only this), and ``adapter_env`` reads
the adapter's settings from ``$BSRKV_TEMPOKV``. Nothing here imports vLLM: it is mixed in
before vLLM's scheduler class (``bsrkv.vllm_ext.scheduler``)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from bsrkv.hostguard import Guard
from bsrkv.tempokv import wire
from bsrkv.vllm_ext.step_trace import GUARD, StepTrace

ENV = "BSRKV_TEMPOKV"


def adapter_env() -> wire.AdapterEnv:
    """``BSRKV_TEMPOKV`` (unset: no adapter, no trace)."""
    raw = os.environ.get(ENV, "")
    if not raw:
        return wire.AdapterEnv(None, "record", None)
    return wire.AdapterEnv.from_json(json.loads(raw))


class StepRecorder:
    """Passive: records each step's decision (request order and tokens). The adapter-off
    side of the on/off test runs the stock scheduler with only this. Everything of it runs
    under the scheduler's guard (``bsrkv.hostguard``): vLLM's own work is never inside."""

    _bk_trace: StepTrace = StepTrace(None)  # until __init__ set the real one
    _bk_guard: Guard = GUARD

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._bk_guard = Guard("bsrkv.vllm_ext", logging.getLogger("bsrkv.vllm_ext"))
        path = adapter_env().trace_path  # a bad $BSRKV_TEMPOKV: refused at start, naming it
        self._bk_trace = StepTrace(Path(path) if path else None, self._bk_guard)

    def _bk_record(self, out: Any) -> None:
        self._bk_trace.write(
            {
                "kind": "step",
                "scheduled": dict(out.num_scheduled_tokens),
                "new": [r.req_id for r in out.scheduled_new_reqs],
                "finished": sorted(out.finished_req_ids),
            }
        )

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        self._bk_guard.call("record", self._bk_record, out)
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        result = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        self._bk_guard.call("record", self._bk_idle)
        return result

    def _bk_idle(self) -> None:
        """The engine has nothing left to run: the trace goes to disk now. A vLLM that
        cannot say (``has_requests`` failing) has it written at every step: its ``guards``
        record must reach the harness whatever the engine's state."""
        try:
            idle = not self.has_requests()  # type: ignore[attr-defined]
        except Exception as exc:
            self._bk_guard.failed("record", exc)  # counted first: the record carries it
            idle = True
        if idle:
            self._bk_trace.flush()
