"""The one home of the restore settings: W, B, the timeouts, L2 load concurrency (FS reads,
Mooncake batches), checksums.

The spec's ``restore:`` section (``RestoreTuning``), the window each command names once
(``sweep.window_chunks``, ``law.windows_chunks``, a failure cell's W; the ladder is W = 0),
the LMCache server module's ``--server-module`` config and the restore core's
``RestoreConfig`` are all built from ``RestoreSettings``. Nothing else declares a default.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bsrkv.restore.restorer import RestoreConfig


class RestoreTuning(BaseModel):
    """Everything about a restore but its window: what a spec's ``restore:`` section holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_timeout_s: float = Field(30.0, gt=0, description="max wait for one window in L1")
    probe_timeout_s: float = Field(10.0, gt=0, description="max wait for one probe (L1 or L2)")
    admission_timeout_s: float = Field(
        120.0, gt=0, description="max wait for the budget B to admit a window"
    )
    # Whole retrieve, admission to last install (0 = none). On the serving stack it must stay
    # below vLLM's 60 s mq_timeout, after which the connector recomputes into the same blocks.
    retrieve_deadline_s: float = Field(45.0, ge=0, description="whole retrieve; 0 = none")
    # After a window timed out, how long its release waits for the late prefetch to land (so
    # the budget and gauge stay exact) before leaving it to a background drain.
    drain_timeout_s: float = Field(5.0, ge=0)
    # Refuse to install a window after a process stall this long (0 = off): vLLM's connector
    # gives up on a server that misses one 10 s PING and recomputes into the same blocks.
    stall_guard_s: float = Field(5.0, ge=0)
    load_concurrency: int = Field(
        1, ge=1, description="L2 loads in flight per rank (FS key reads, Mooncake batches)"
    )
    checksum: bool = Field(True, description="a checksum per L2 object, verified before install")
    # xxh3_128 hashes at memory speed (bench/checksum_speed.py); sha256 is the cryptographic
    # option. The names are the adapters' (bsrkv.lmcache_ext.adapters.checksum).
    checksum_algorithm: Literal["xxh3_128", "sha256"] = Field(
        "xxh3_128", description="the L2 objects' checksum: xxh3_128 or sha256"
    )
    use_odirect: bool = Field(False, description="FS L2 bypasses the page cache (O_DIRECT)")
    # How a window reaches L1 (bsrkv.lmcache_ext.bsr.windows): "direct", staged by the restoring
    # thread (the L1 and L2 calls LMCache's prefetch controller makes, without its per-window
    # bookkeeping); "prefetch", one LMCache prefetch per window. The whole plan (W = 0) is
    # always LMCache's own prefetch.
    window_staging: Literal["direct", "prefetch"] = Field(
        "direct", description="a window staged directly into L1, or by LMCache's prefetch"
    )
    # Install read-back (bsrkv.restore.readback): each installed window is read back from
    # the engine's KV through LMCache's own store copy and compared with the staged bytes; a
    # mismatch fails the retrieve closed. On by default (qualification).
    readback: bool = Field(True, description="read each installed window back, compare its bytes")


class RestoreSettings(RestoreTuning):
    """A restore's whole configuration: the tuning plus the window W and the budget B."""

    window_chunks: int = Field(0, ge=0, description="W; 0 = the stock whole-plan path")
    admission_budget_chunks: int = Field(0, ge=0, description="B, process-wide; 0 means B = W")

    @model_validator(mode="after")
    def _budget_covers_window(self) -> RestoreSettings:
        b, w = self.admission_budget_chunks, self.window_chunks
        if w and 0 < b < w:
            raise ValueError(f"admission_budget_chunks = {b} < window_chunks = {w}: set B >= W")
        return self

    @classmethod
    def of(
        cls, tuning: RestoreTuning, window_chunks: int, budget_chunks: int = 0
    ) -> RestoreSettings:
        """These tunings with window W and budget B (B only means something when W > 0)."""
        return cls(
            **tuning.model_dump(include=set(RestoreTuning.model_fields)),
            window_chunks=window_chunks,
            admission_budget_chunks=budget_chunks if window_chunks else 0,
        )

    def with_window(self, window_chunks: int, budget_chunks: int = 0) -> RestoreSettings:
        return RestoreSettings.of(self, window_chunks, budget_chunks)

    @property
    def budget_chunks(self) -> int:
        """B in effect: B = W when unset."""
        return self.admission_budget_chunks or self.window_chunks

    def tuning(self) -> RestoreTuning:
        return RestoreTuning(
            **self.model_dump(exclude={"window_chunks", "admission_budget_chunks"})
        )

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()

    def core_config(self, pipeline: bool = True) -> RestoreConfig:
        """The restore core's own frozen config, built from these settings."""
        return RestoreConfig(
            window_chunks=self.window_chunks,
            admission_budget_chunks=self.admission_budget_chunks,
            window_timeout_s=self.window_timeout_s,
            admission_timeout_s=self.admission_timeout_s,
            retrieve_deadline_s=self.retrieve_deadline_s,
            pipeline=pipeline,
            readback=self.readback,
        )
