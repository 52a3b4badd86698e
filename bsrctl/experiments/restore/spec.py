"""Specs of `bsrctl ladder | sweep | law`: one YAML file, one section per command.

Layout (every field optional except the section the command needs)::

    stack: {...}            # bsrctl.specs.StackSpec: the serving stack (vLLM, LMCache, Mooncake)
    restore: {...}          # bsrkv.settings.RestoreTuning: timeouts, load concurrency, checksum
    registration: auto      # state geometry: auto (the model's config.json + TP, chunk, dtypes),
                            # tiny-llama | dsv4-flash (the paper's MTP-off), a registration
                            # .yaml file or an inline mapping (bsrctl.registration.declared)
    storage: {...}          # --stack storage only: TP ranks, L2 root, destination, margins
    salt: bsrctl-e1         # prompts / canonical KV bytes derive from it
    max_tokens: 16          # tokens generated per request (serving)
    aux_bytes: 0            # restore-pool allowance beyond W*c (the paper's aux)
    memory_reserve_bytes: 4 GiB   # an L1 rung that leaves less RAM free is not deployed
    ladder: {sizes_tokens, rungs_bytes, ...}       # `bsrctl ladder` (W = 0)
    sweep:  {sizes_tokens, window_chunks, ...}     # `bsrctl sweep`  (W fixed, L1 fixed)
    law:    {tokens, windows_chunks}               # `bsrctl law`    (one size, W varies)

Every section takes ``repeats`` and ``warmup`` (``Repeated``, below: their one home):
each timed measure of a point is measured ``repeats`` times in rotated rounds, after
``warmup`` discarded rounds. Defaults per command: sweep 6 repeats (its timings are the
figures the paper's E1 and the whole-plan contrast compare; 6 is the fewest whose paired
contrast can be decided at 95 %: every pair on one side has a sign-test p of 2/2^6 = 0.031,
at 5 repeats 0.063, ``stats.decisive_repeats``; a Mann-Whitney U test of 6 per side reaches
2/C(12,6) = 0.002), law 1 and ladder 1 (their verdicts are byte figures, exact in one measurement; a
ladder rung is a fresh deployment each). ``warmup`` defaults to 1 round when repeats > 1
(each arm's first touch, the prefix seeded and the caches cold, is never a sample), else 0.

The chunk size is ``stack.lmcache.chunk_size`` and the sweep/law L1 is
``stack.lmcache.l1_size_bytes`` on both stacks; each command names its window once (ladder 0,
``sweep.window_chunks``, each of ``law.windows_chunks``). Byte sizes take integers or
"2 GiB"-style strings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from bsrctl.errors import BadInput
from bsrctl.spec_io import ByteSize, Strict, describe_error, read_yaml
from bsrctl.specs import TargetSpec, select_stack

COMMANDS = ("ladder", "sweep", "law")
STACKS = ("serving", "storage", "attach")  # what stack.kind (or --stack) may name here


def _increasing(name: str, values: list[int]) -> list[int]:
    if not values:
        raise ValueError(f"{name} is empty; list at least one value")
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"must be strictly increasing, got {values}; sort them, drop duplicates")
    return values


SWEEP_REPEATS = 6  # see the module doc: the fewest whose paired contrast can be decided


def _repeats(default: int, why: str) -> Any:
    return Field(
        default,
        ge=1,
        description=f"measurements of every timed measure of a point (default {default}: "
        f"{why}); timed rounds visit the points in an order rotated by one each round, so drift "
        f"hits every point alike; byte measures must be identical across them",
    )


def _warmup() -> Any:
    return Field(
        None,
        ge=0,
        description="rounds run first and discarded (default: 1 when repeats > 1, else 0)",
    )


class Repeated:
    """``repeats`` and ``warmup`` of a section (module doc); each section declares the two
    fields last, with ``_repeats`` and ``_warmup``, so its own fields lead its listing."""

    @property
    def warmup_rounds(self) -> int:
        warmup, repeats = getattr(self, "warmup", None), int(getattr(self, "repeats", 1))
        if warmup is not None:
            return int(warmup)
        return 1 if repeats > 1 else 0


class LadderSpec(Repeated, Strict):
    """Whole-plan path (W = 0): raise L1 through the rungs until full-prefix reuse passes.
    A rung's repeats run back to back on its own deployment (one rung is one deployment)."""

    sizes_tokens: list[Annotated[int, Field(gt=0)]]
    rungs_bytes: list[ByteSize]
    redo_unknown: bool = Field(True, description="redo once a rung that failed for no capacity")
    repeats: int = _repeats(1, "a rung's verdict is bytes and capacity, exact at once")
    warmup: int | None = _warmup()

    @field_validator("sizes_tokens", "rungs_bytes")
    @classmethod
    def _sorted(cls, v: list[int], info: Any) -> list[int]:
        return _increasing(info.field_name, v)


class SweepSpec(Repeated, Strict):
    """One deployment, W fixed, L1 fixed: the prefix size varies (the paper's E1)."""

    sizes_tokens: list[Annotated[int, Field(gt=0)]]
    window_chunks: int = Field(32, ge=0, description="W (0 runs the whole-plan path)")
    admission_budget_chunks: int = Field(0, ge=0, description="B; 0 means B = W")
    whole_plan_contrast: bool = Field(
        False, description="also run each size at W = 0 on the same engines (needs L1 to fit)"
    )
    whole_plan_max_ratio: float | None = Field(
        None,
        gt=0,
        description="with whole_plan_contrast: the claim W's TTFT (storage: restore time) / "
        "the whole plan's <= this, judged per size on the paired repeats' interval (PASS, "
        "FAIL, UNKNOWN); unset: the ratio and its interval are reported, not judged",
    )
    repeats: int = _repeats(
        SWEEP_REPEATS, "the fewest whose paired whole-plan contrast can be decided at 95 %"
    )
    warmup: int | None = _warmup()

    @field_validator("sizes_tokens")
    @classmethod
    def _sorted(cls, v: list[int]) -> list[int]:
        return _increasing("sizes_tokens", v)


class LawSpec(Repeated, Strict):
    """One prefix size, W over a list: fit the restore-pool peak against W."""

    tokens: int = Field(gt=0)
    windows_chunks: list[Annotated[int, Field(gt=0)]] = [8, 16, 32, 64]
    slope_tolerance: float = Field(0.01, gt=0, description="|slope - c| <= this * c")
    min_r2: float = Field(0.999, gt=0, le=1)
    repeats: int = _repeats(1, "the law is a byte fit, exact at once")
    warmup: int | None = _warmup()

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


class ExperimentSpec(TargetSpec):
    """One YAML file: stack, geometry, and a section per command (see the module doc)."""

    salt: str = Field("bsrctl-e1", min_length=1)
    ladder: LadderSpec | None = None
    sweep: SweepSpec | None = None
    law: LawSpec | None = None


def load_experiment(
    path: Path, command: str, stack: str | None = None
) -> tuple[ExperimentSpec, dict[str, Any]]:
    """Load and check a spec for one command; ``stack`` (``--stack``) overrides ``stack.kind``
    for this run (``select_stack``): the parsed spec's ``stack.kind`` is the one the run
    uses. BadInput (one line) otherwise."""
    if command not in COMMANDS:
        raise BadInput(f"unknown command {command!r}; valid: {', '.join(COMMANDS)}")
    if stack is not None and stack not in STACKS:  # before anything is read
        raise BadInput(f"--stack: {stack!r} is not one of {', '.join(STACKS)}")
    raw = read_yaml(path)
    try:
        spec = ExperimentSpec.model_validate(raw)
    except ValidationError as exc:
        raise BadInput(f"{path}: {_describe(exc)}") from None
    try:
        spec = select_stack(spec, stack, STACKS)
        check_spec(spec, command)
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


def check_spec(spec: ExperimentSpec, command: str) -> None:
    """Cross-field checks on the run's stack (``stack.kind``): each message names the field
    and the fix."""
    stack = spec.stack.kind
    section = getattr(spec, command)
    if section is None:
        have = [c for c in COMMANDS if getattr(spec, c) is not None]
        raise BadInput(
            f"{command}: section missing; add a `{command}:` section "
            f"(sections here: {', '.join(have) or 'none'}; see ladders/cpu-e1.yaml)"
        )
    if command == "ladder" and spec.stack.kind == "attach":
        raise BadInput(
            "stack.kind: attach: the ladder deploys one L1 per rung, and an attached L1 is the "
            "operator's; run sweep or law against it, or the ladder on kind serving"
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
    if stack != "storage":
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
    windows = {"sweep": [spec.sweep.window_chunks] if spec.sweep else [], "law": (
        list(spec.law.windows_chunks) if spec.law else [])}.get(command, [])  # fmt: skip
    ranks_per_l1 = 1 if stack == "storage" else reg.tp_size  # storage: one L1 per rank
    pool = max(windows, default=0) * reg.bytes_per_chunk * ranks_per_l1 + reg.aux_bytes
    l1 = spec.stack.lmcache.l1_size_bytes
    if stack != "attach" and pool > l1 and not windows:  # the ladder: W = 0, aux alone
        raise BadInput(
            f"aux_bytes: {reg.aux_bytes} B > stack.lmcache.l1_size_bytes = {l1}; lower "
            f"aux_bytes or raise L1"
        )
    if stack != "attach" and pool > l1:  # an attached L1 is the operator's, read at run time
        field = "sweep.window_chunks" if command == "sweep" else "law.windows_chunks"
        raise BadInput(
            f"{field}: W = {max(windows)} needs a restore pool of {pool} B (W x c x "
            f"{ranks_per_l1} ranks + aux) > stack.lmcache.l1_size_bytes = {l1}; raise L1 "
            f"or lower W"
        )
    if command == "sweep":  # W and B are checked where they live: RestoreSettings
        try:
            spec.settings(spec.sweep.window_chunks, spec.sweep.admission_budget_chunks)
        except ValidationError as exc:
            why = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise BadInput(f"sweep.admission_budget_chunks: {why} or 0") from None
    if command == "sweep" and spec.sweep.whole_plan_contrast:
        need = (max(sizes) // chunk) * reg.bytes_per_chunk * ranks_per_l1
        if need > l1:
            raise BadInput(
                f"sweep.whole_plan_contrast: the largest whole plan needs {need} B of L1 > "
                f"stack.lmcache.l1_size_bytes = {l1}; raise L1, shrink the sizes or turn it off"
            )
