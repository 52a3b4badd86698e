"""Specs of `bsrctl ladder | sweep | law`: one YAML file, one section per command.

Layout (every field optional except the section the command needs)::

    stack: {...}            # bsrctl.specs.StackSpec: the serving stack (vLLM, LMCache, Mooncake)
    registration: tiny-llama   # state geometry: tiny-llama | dsv4-flash (the paper's MTP-off)
    storage: {...}          # --stack storage only: TP ranks, L2 root, destination, margins
    salt: bsrctl-e1         # prompts / canonical KV bytes derive from it
    max_tokens: 16          # tokens generated per request (serving)
    aux_bytes: 0            # restore-pool allowance beyond W*c (the paper's aux)
    memory_reserve_bytes: 4 GiB   # an L1 rung that leaves less RAM free is not deployed
    ladder: {sizes_tokens, rungs_bytes, ...}       # `bsrctl ladder` (W = 0)
    sweep:  {sizes_tokens, window_chunks, ...}     # `bsrctl sweep`  (W fixed, L1 fixed)
    law:    {tokens, windows_chunks}               # `bsrctl law`    (one size, W varies)

The chunk size is ``stack.lmcache.chunk_size`` and the sweep/law L1 is
``stack.lmcache.l1_size_bytes`` on both stacks; the window is set per command (ladder 0,
sweep ``sweep.window_chunks``, law each of ``law.windows_chunks``), so
``stack.lmcache.window_chunks`` must stay 0. Byte sizes take integers or "2 GiB"-style strings.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, field_validator

from bsrctl.errors import BadInput
from bsrctl.registration import Registration, dsv4_flash_mtp_off, tiny_llama_cpu
from bsrctl.specs import StackSpec, Strict, describe_error, read_yaml

COMMANDS = ("ladder", "sweep", "law")
STACKS = ("serving", "storage")
GEOMETRIES = ("tiny-llama", "dsv4-flash")
UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
UNITS |= {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_bytes(value: Any) -> Any:
    """2147483648, "2 GiB", "512MiB", "1.5 GiB" -> int bytes; anything else left to pydantic."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        if not m or m.group(2).lower() not in UNITS:
            raise ValueError(f"{value!r} is not a byte size; write e.g. 2147483648 or '2 GiB'")
        n = float(m.group(1)) * UNITS[m.group(2).lower()]
        if n != int(n):
            raise ValueError(f"{value!r} is not a whole number of bytes")
        return int(n)
    return value


ByteSize = Annotated[int, BeforeValidator(parse_bytes), Field(gt=0)]


def _increasing(name: str, values: list[int]) -> list[int]:
    if not values:
        raise ValueError(f"{name} is empty; list at least one value")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"must be strictly increasing, got {values}; sort them, drop duplicates")
    return values


class StorageSpec(Strict):
    """The in-process storage stack (``--stack storage``): no model, real L1 + FS L2."""

    tp_ranks: int = Field(1, ge=1, description="ranks, one StorageManager each (c is per rank)")
    root_dir: Path | None = Field(None, description="L2 files go to ROOT/l2; None: the run dir")
    keep_files: bool = Field(False, description="keep ROOT/l2 after the run (else removed)")
    destination: Literal["verify", "mmap", "null"] = Field(
        "verify", description="verify: check every installed byte against canonical bytes"
    )
    use_odirect: bool = False
    load_concurrency: int = Field(1, ge=1)
    drop_page_cache: bool = Field(False, description="fadvise(DONTNEED) L2 files before restores")
    disk_reserve_bytes: ByteSize = Field(2 << 30, description="free disk to keep beyond L2 files")
    window_timeout_s: float = Field(120.0, gt=0)


class LadderSpec(Strict):
    """Whole-plan path (W = 0): raise L1 through the rungs until full-prefix reuse passes."""

    sizes_tokens: list[Annotated[int, Field(gt=0)]]
    rungs_bytes: list[ByteSize]
    redo_unknown: bool = Field(True, description="redo once a rung that failed for no capacity")

    @field_validator("sizes_tokens", "rungs_bytes")
    @classmethod
    def _sorted(cls, v: list[int], info: Any) -> list[int]:
        return _increasing(info.field_name, v)


class SweepSpec(Strict):
    """One deployment, W fixed, L1 fixed: the prefix size varies (the paper's E1)."""

    sizes_tokens: list[Annotated[int, Field(gt=0)]]
    window_chunks: int = Field(32, ge=0, description="W (0 runs the whole-plan path)")
    admission_budget_chunks: int = Field(0, ge=0, description="B; 0 means B = W")
    whole_plan_contrast: bool = Field(
        False, description="also run each size at W = 0 on the same engines (needs L1 to fit)"
    )

    @field_validator("sizes_tokens")
    @classmethod
    def _sorted(cls, v: list[int]) -> list[int]:
        return _increasing("sizes_tokens", v)


class LawSpec(Strict):
    """One prefix size, W over a list: fit the restore-pool peak against W."""

    tokens: int = Field(gt=0)
    windows_chunks: list[Annotated[int, Field(gt=0)]] = [8, 16, 32, 64]
    slope_tolerance: float = Field(0.01, gt=0, description="|slope - c| <= this * c")
    min_r2: float = Field(0.999, gt=0, le=1)

    @field_validator("windows_chunks")
    @classmethod
    def _three(cls, v: list[int]) -> list[int]:
        _increasing("windows_chunks", v)
        if len(v) < 3:
            raise ValueError(
                f"needs at least 3 distinct windows to fit a line (R² of 2 points is always 1), "
                f"got {v}"
            )
        return v


class ExperimentSpec(Strict):
    """One YAML file: stack, geometry, and a section per command (see the module doc)."""

    stack: StackSpec = StackSpec()
    registration: Literal["tiny-llama", "dsv4-flash"] = "tiny-llama"
    storage: StorageSpec = StorageSpec()
    salt: str = Field("bsrctl-e1", min_length=1)
    max_tokens: int = Field(16, gt=0)
    aux_bytes: int = Field(0, ge=0, description="restore-pool allowance beyond W*c, per rank")
    memory_reserve_bytes: ByteSize = Field(
        4 << 30, description="never deploy an L1 that leaves less than this much RAM free"
    )
    ladder: LadderSpec | None = None
    sweep: SweepSpec | None = None
    law: LawSpec | None = None

    @property
    def chunk_tokens(self) -> int:
        return self.stack.lmcache.chunk_size

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


def load_experiment(path: Path, command: str, stack: str) -> tuple[ExperimentSpec, dict[str, Any]]:
    """Load and check a spec for one command on one stack; BadInput (one line) otherwise."""
    if command not in COMMANDS:
        raise BadInput(f"unknown command {command!r}; valid: {', '.join(COMMANDS)}")
    if stack not in STACKS:
        raise BadInput(f"--stack: {stack!r} is not one of {', '.join(STACKS)}")
    raw = read_yaml(path)
    try:
        spec = ExperimentSpec.model_validate(raw)
    except ValidationError as exc:
        raise BadInput(f"{path}: {_describe(exc)}") from None
    try:
        check_spec(spec, command, stack)
    except BadInput as exc:
        raise BadInput(f"{path}: {exc}") from None
    return spec, raw


def _describe(exc: ValidationError) -> str:
    """describe_error, but an unknown field inside an optional section lists that section's
    fields (bsrctl.specs cannot see through `LadderSpec | None`)."""
    err = exc.errors()[0]
    loc = err["loc"]
    if err["type"] == "extra_forbidden" and len(loc) >= 2:
        model: Any = ExperimentSpec
        for part in loc[:-1]:
            field = model.model_fields.get(str(part)) if isinstance(model, type) else None
            ann = field.annotation if field else None
            subs = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type)]
            model = next((a for a in subs if issubclass(a, BaseModel)), None)
        if model is not None:
            where = ".".join(str(p) for p in loc)
            return f"{where}: unknown field; valid fields here: {', '.join(model.model_fields)}"
    return describe_error(ExperimentSpec, exc)


def sizes_of(spec: ExperimentSpec, command: str) -> list[int]:
    if command == "ladder":
        return list(spec.ladder.sizes_tokens) if spec.ladder else []
    if command == "sweep":
        return list(spec.sweep.sizes_tokens) if spec.sweep else []
    return [spec.law.tokens] if spec.law else []


def check_spec(spec: ExperimentSpec, command: str, stack: str) -> None:
    """Cross-field checks: each message names the field and the fix."""
    section = getattr(spec, command)
    if section is None:
        have = [c for c in COMMANDS if getattr(spec, c) is not None]
        raise BadInput(
            f"{command}: section missing; add a `{command}:` section "
            f"(sections here: {', '.join(have) or 'none'}; see ladders/cpu-e1.yaml)"
        )
    if spec.stack.lmcache.window_chunks:
        raise BadInput(
            "stack.lmcache.window_chunks: the window is set per command (ladder W = 0, "
            "sweep.window_chunks, law.windows_chunks); leave it 0"
        )
    chunk = spec.chunk_tokens
    sizes = sizes_of(spec, command)
    for i, n in enumerate(sizes):
        if n < chunk:
            field = f"{command}.{'tokens' if command == 'law' else f'sizes_tokens[{i}]'}"
            raise BadInput(
                f"{field}: {n} tokens is less than one {chunk}-token chunk "
                f"(stack.lmcache.chunk_size); use at least {chunk}"
            )
    if stack == "serving":
        longest = max(sizes) + spec.max_tokens
        if longest > spec.stack.vllm.max_model_len:
            raise BadInput(
                f"stack.vllm.max_model_len: {spec.stack.vllm.max_model_len} < {longest} "
                f"(largest {command} size + max_tokens); raise it or shorten the sizes"
            )
    reg = spec.registration_for(stack)
    if command == "law":
        chunks = spec.law.tokens // chunk
        too_big = [w for w in spec.law.windows_chunks if w > chunks]
        if too_big:
            raise BadInput(
                f"law.windows_chunks: W {too_big} exceed the prefix's {chunks} chunks (peak "
                f"would be N*c, not W*c); raise law.tokens to >= "
                f"{max(too_big) * chunk} or drop those windows"
            )
    if command == "sweep" and spec.sweep.admission_budget_chunks:
        b, w = spec.sweep.admission_budget_chunks, spec.sweep.window_chunks
        if b < w:
            raise BadInput(f"sweep.admission_budget_chunks: B = {b} < W = {w}; set B >= W or 0")
    if command == "sweep" and spec.sweep.whole_plan_contrast:
        ranks_per_l1 = 1 if stack == "storage" else reg.tp_size  # storage: one L1 per rank
        need = (max(sizes) // chunk) * reg.bytes_per_chunk * ranks_per_l1
        l1 = spec.stack.lmcache.l1_size_bytes
        if need > l1:
            raise BadInput(
                f"sweep.whole_plan_contrast: the largest whole plan needs {need} B of L1 > "
                f"stack.lmcache.l1_size_bytes = {l1}; raise L1, shrink the sizes or turn it off"
            )
