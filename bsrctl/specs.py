"""Pydantic models of the YAML specs users edit. Unknown fields are errors (extra="forbid")."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from bsrctl.errors import BadInput
from bsrctl.registration import Registration, dsv4_flash_mtp_off, tiny_llama_cpu
from bsrctl.settings import RestoreSettings, RestoreTuning
from bsrctl.spec_io import ByteSize, Strict, describe_error, read_yaml


class VllmSpec(Strict):
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    max_model_len: int = Field(20480, gt=0)
    kvcache_space_gib: int = Field(1, gt=0, description="VLLM_CPU_KVCACHE_SPACE, whole GiB")
    tensor_parallel_size: int = Field(1, ge=1)
    startup_timeout_s: float = Field(240.0, gt=0)
    request_timeout_s: float = Field(300.0, gt=0)
    model: str = Field("tiny", description="'tiny' builds the local tiny Llama; else a folder")
    max_num_seqs: int = Field(4, ge=1, description="vLLM's running slots (--max-num-seqs)")


class LmcacheSpec(Strict):
    port: int = Field(0, ge=0, le=65535)
    http_port: int = Field(0, ge=0, le=65535)
    l1_size_bytes: int = Field(1 << 30, gt=0, description="L1 (DRAM) capacity")
    chunk_size: int = Field(256, gt=0, description="tokens per chunk")
    fs_l2: bool = Field(True, description="filesystem L2 under the run folder")
    startup_timeout_s: float = Field(120.0, gt=0)


class MooncakeSpec(Strict):
    enabled: bool = False
    segment_size_bytes: int = Field(1 << 30, gt=0)
    startup_timeout_s: float = Field(60.0, gt=0)


class StackSpec(Strict):
    kind: Literal["serving", "storage", "sim"] = "serving"
    vllm: VllmSpec = VllmSpec()
    lmcache: LmcacheSpec = LmcacheSpec()
    mooncake: MooncakeSpec = MooncakeSpec()


class StorageSpec(Strict):
    """The in-process storage stack (``--stack storage``): no model, real L1 + FS L2."""

    tp_ranks: int = Field(1, ge=1, description="ranks, one StorageManager each (c is per rank)")
    root_dir: Path | None = Field(None, description="L2 files go to ROOT/l2; None: the run dir")
    keep_files: bool = Field(False, description="keep ROOT/l2 after the run (else removed)")
    destination: Literal["verify", "mmap", "null"] = Field(
        "verify", description="verify: check every installed byte against canonical bytes"
    )
    drop_page_cache: bool = Field(False, description="fadvise(DONTNEED) L2 files before restores")
    disk_reserve_bytes: ByteSize = Field(2 << 30, description="free disk to keep beyond L2 files")


class TargetSpec(Strict):
    """What a restore target needs from a spec: the stack, the geometry, the restore tuning
    (W comes from each command's own section), and this machine's margins."""

    stack: StackSpec = StackSpec()
    restore: RestoreTuning = RestoreTuning()
    registration: Literal["tiny-llama", "dsv4-flash"] = "tiny-llama"
    storage: StorageSpec = StorageSpec()
    max_tokens: int = Field(16, gt=0)
    aux_bytes: int = Field(0, ge=0, description="restore-pool allowance beyond W*c, per rank")
    memory_reserve_bytes: ByteSize = Field(
        4 << 30, description="never deploy an L1 that leaves less than this much RAM free"
    )

    @property
    def chunk_tokens(self) -> int:
        return self.stack.lmcache.chunk_size

    def settings(self, window_chunks: int, budget_chunks: int = 0) -> RestoreSettings:
        """The restore settings of one deployment: this spec's tuning with W and B."""
        return RestoreSettings.of(self.restore, window_chunks, budget_chunks)

    def tp_size(self, stack: str) -> int:
        return self.storage.tp_ranks if stack == "storage" else self.stack.vllm.tensor_parallel_size

    def registration_for(self, stack: str) -> Registration:
        """The geometry restored: what c and the digest are checked against."""
        tp, chunk = self.tp_size(stack), self.chunk_tokens
        if self.registration == "dsv4-flash":
            reg = dsv4_flash_mtp_off(tp_size=tp, chunk_tokens=chunk)
        else:
            if 2 % tp:
                field = "storage.tp_ranks"
                if stack == "serving":
                    field = "stack.vllm.tensor_parallel_size"
                raise BadInput(
                    f"{field}: tiny-llama has 2 KV heads, TP {tp} does not divide them; use 1 or 2"
                )
            reg = tiny_llama_cpu(chunk_tokens=chunk, tp_size=tp)
        return Registration(
            reg.model, reg.tensors, reg.groups, reg.tp_size, reg.chunk_tokens, self.aux_bytes
        )


class RoundTripSpec(Strict):
    """The issue-2 round trip: store a prompt's KV, forget it locally, reload from each tier."""

    stack: StackSpec = StackSpec()
    restore: RestoreTuning = RestoreTuning()
    prompt_tokens: int = Field(4096, gt=0)
    max_tokens: int = Field(16, gt=0)
    salt: str = Field("bsrctl-demo", min_length=1)
    tiers: list[Literal["l1", "fs", "mooncake"]] = ["l1", "fs"]

    @model_validator(mode="after")
    def _fits(self) -> RoundTripSpec:
        if self.prompt_tokens + self.max_tokens > self.stack.vllm.max_model_len:
            raise ValueError(
                f"prompt_tokens + max_tokens = {self.prompt_tokens + self.max_tokens} exceeds "
                f"stack.vllm.max_model_len = {self.stack.vllm.max_model_len}; raise "
                f"max_model_len or shorten the prompt"
            )
        if "mooncake" in self.tiers and not self.stack.mooncake.enabled:
            raise ValueError("tiers names 'mooncake' but stack.mooncake.enabled is false")
        return self


def load_stack_section(path: Path) -> tuple[StackSpec, RestoreTuning]:
    """The `stack:` and `restore:` sections of any spec (round trip, ladder, sweep, law,
    failmatrix): what `bsrctl stack up` deploys (W = 0)."""
    doc = read_yaml(path)
    try:
        stack = StackSpec.model_validate(doc.get("stack", {}))
    except ValidationError as exc:
        raise BadInput(f"{path}: stack.{describe_error(StackSpec, exc)}") from None
    try:
        return stack, RestoreTuning.model_validate(doc.get("restore", {}))
    except ValidationError as exc:
        raise BadInput(f"{path}: restore.{describe_error(RestoreTuning, exc)}") from None
