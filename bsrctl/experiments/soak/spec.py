"""The `bsrctl soak` spec: one serving deployment, a stream of concurrent requests over
prefixes of mixed sizes, and a catalogue of failure-matrix cells the seeded schedule draws
its faults from.

Layout::

    stack: {...}                  # bsrctl.specs.StackSpec (as a failure matrix's)
    restore: {...}                # bsrkv.settings.RestoreTuning
    workload:                     # the failure matrix's WorkloadSpec: W, B, max_tokens, salt
      window_chunks: 4
      admission_budget_chunks: 4
      max_tokens: 8
      salt: soak-cpu
    soak:
      prefix_tokens: [1024, 2048, 4000]  # the reused prefixes
      concurrency: 3                     # requests per round, sent at once
      request_deadline_s: 60             # a request answering later is a violation
      mean_gap_s: 10                     # the schedule's mean gap between faults
      quiesce_s: 5                       # after the load: wait, then nothing may be left
      aux_bytes: 0                       # the pool bound is B x c + aux (c: live bytes/chunk)
    cells:                        # the catalogue: failure-matrix cells safe to repeat
      - {id: window-timeout, fault: window_timeout, window: 1, source: fs, expect: recompute}

A scheduled fault takes its cell's settings with the schedule's window and prefix.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from bsrctl.errors import BadInput
from bsrctl.experiments.failmatrix.spec import Cell, FailMatrixSpec, WorkloadSpec
from bsrctl.spec_io import Strict, describe_error, read_yaml
from bsrctl.specs import StackSpec
from bsrkv.settings import RestoreSettings, RestoreTuning

# failure-matrix faults a soak may repeat on one deployment: each arms fault-wrapper rules or
# damages one object, and none stops a process (soak.schedule.REPEATABLE and two more)
SOAK_FAULTS = ("window_timeout", "object_corrupted", "object_truncated", "load_fails_always",
               "slow_tier")  # fmt: skip


class SoakSection(Strict):
    prefix_tokens: list[int] = Field(min_length=1, description="the reused prefixes' tokens")
    concurrency: int = Field(
        3, ge=1, le=64, description="requests per round, sent at once, of distinct prefixes"
    )
    request_deadline_s: float = Field(60.0, gt=0, description="a later answer is a violation")
    mean_gap_s: float = Field(10.0, gt=0, description="the schedule's mean gap between faults")
    quiesce_s: float = Field(5.0, ge=0, description="after the load, before the final checks")
    aux_bytes: int = Field(0, ge=0, description="the pool bound's aux: B x c + aux per rank")

    @model_validator(mode="after")
    def _positive(self) -> SoakSection:
        bad = [n for n in self.prefix_tokens if n <= 0]
        if bad:
            raise ValueError(f"prefix_tokens must be positive, got {bad}")
        return self


class SoakSpec(Strict):
    stack: StackSpec = StackSpec()
    restore: RestoreTuning = RestoreTuning()
    workload: WorkloadSpec
    soak: SoakSection
    cells: list[Cell] = Field(min_length=1, description="the faults the schedule draws")

    @model_validator(mode="after")
    def _coherent(self) -> SoakSpec:
        for c in self.cells:
            if c.fault not in SOAK_FAULTS:
                raise ValueError(
                    f"cell {c.id!r}: fault {c.fault} cannot repeat on one deployment; a soak "
                    f"draws from {list(SOAK_FAULTS)}"
                )
        if self.soak.concurrency > len(self.soak.prefix_tokens):
            raise ValueError(
                f"soak.concurrency: {self.soak.concurrency} requests per round need as many "
                f"prefixes, soak.prefix_tokens has {len(self.soak.prefix_tokens)}; a round's "
                "requests are of distinct prefixes (one prompt twice at once shares vLLM's "
                "local blocks)"
            )
        longest = max(self.soak.prefix_tokens) + self.workload.max_tokens
        if longest > self.stack.vllm.max_model_len:
            raise ValueError(
                f"soak.prefix_tokens: {max(self.soak.prefix_tokens)} + workload.max_tokens "
                f"exceeds stack.vllm.max_model_len {self.stack.vllm.max_model_len}"
            )
        if min(self.soak.prefix_tokens) < self.stack.lmcache.chunk_size + 1:
            raise ValueError(
                f"soak.prefix_tokens: each needs more than one chunk of "
                f"{self.stack.lmcache.chunk_size} tokens (an external hit to restore)"
            )
        self.as_matrix()  # every cell as the failure matrix validates it, at the smallest prefix
        return self

    def windows(self) -> int:
        """Windows of the smallest prefix: the schedule's windows are 0..windows-1."""
        chunks = min(self.soak.prefix_tokens) // self.stack.lmcache.chunk_size
        return math.ceil(chunks / self.workload.window_chunks)

    def settings(self) -> RestoreSettings:
        wl = self.workload
        return RestoreSettings.of(self.restore, wl.window_chunks, wl.admission_budget_chunks)

    def as_matrix(self) -> FailMatrixSpec:
        """The failure matrix of the catalogue at the smallest prefix (the deployment, the
        seeding and the injectors are the matrix's): windows beyond it are refused here."""
        wl = self.workload.model_copy(update={"prompt_tokens": min(self.soak.prefix_tokens)})
        try:
            return FailMatrixSpec(
                stack=self.stack, restore=self.restore, workload=wl, cells=self.cells
            )
        except ValidationError as exc:  # the cell's own field named, as the matrix names it
            why = describe_error(FailMatrixSpec, exc).removeprefix("Value error, ")
            raise ValueError(f"{why} (at the smallest prefix)") from None


def load_soak(path: Path) -> tuple[SoakSpec, dict[str, Any]]:
    raw = read_yaml(path)
    try:
        return SoakSpec.model_validate(raw), raw
    except ValidationError as exc:
        raise BadInput(f"{path}: {describe_error(SoakSpec, exc)}") from None
