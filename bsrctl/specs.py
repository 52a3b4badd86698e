"""Pydantic models of the YAML specs users edit. Unknown fields are errors (extra="forbid")."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bsrctl.errors import BadInput

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VllmSpec(Strict):
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    max_model_len: int = Field(20480, gt=0)
    kvcache_space_gib: int = Field(1, gt=0, description="VLLM_CPU_KVCACHE_SPACE, whole GiB")
    tensor_parallel_size: int = Field(1, ge=1)
    startup_timeout_s: float = Field(240.0, gt=0)
    request_timeout_s: float = Field(300.0, gt=0)
    model: str = Field("tiny", description="'tiny' builds the local tiny Llama; else a folder")


class LmcacheSpec(Strict):
    port: int = Field(0, ge=0, le=65535)
    http_port: int = Field(0, ge=0, le=65535)
    l1_size_bytes: int = Field(1 << 30, gt=0, description="L1 (DRAM) capacity")
    chunk_size: int = Field(256, gt=0, description="tokens per chunk")
    fs_l2: bool = Field(True, description="filesystem L2 under the run folder")
    window_chunks: int = Field(0, ge=0, description="BSR window W; 0 = stock whole-plan path")
    admission_budget_chunks: int = Field(0, ge=0, description="BSR budget B; 0 means B = W")
    window_timeout_s: float = Field(30.0, gt=0)
    load_concurrency: int = Field(1, ge=1, description="FS L2 load concurrency")
    checksum: bool = Field(True, description="sha256 per L2 object, verified before install")
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


class RoundTripSpec(Strict):
    """The issue-2 round trip: store a prompt's KV, forget it locally, reload from each tier."""

    stack: StackSpec = StackSpec()
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


def read_yaml(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"spec file {path} does not exist; pass the path of a YAML spec")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BadInput(f"{path}: not valid YAML ({exc}); fix the syntax") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: the top level must be a mapping of fields")
    return doc


def describe_error(model: type[BaseModel], exc: ValidationError) -> str:
    """One line: the first error's field path, what is wrong, and how to fix it."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(spec)"
    if err["type"] == "extra_forbidden":
        parent = _submodel(model, err["loc"][:-1])
        valid = ", ".join(parent.model_fields) if parent else "see the docs"
        return f"{where}: unknown field; valid fields here: {valid}"
    if err["type"] == "literal_error":
        return f"{where}: {err['msg']}"
    return f"{where}: {err['msg']} (got {err.get('input')!r})"


def _submodel(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    cur: Any = model
    for part in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        field = cur.model_fields.get(str(part))
        if field is None:
            return None
        cur = _model_in(field.annotation)
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _model_in(annotation: Any) -> Any:
    """The model inside `X | None` (an optional section), else the annotation itself."""
    models = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else annotation


def load_spec(path: Path, model: type[M]) -> tuple[M, dict[str, Any]]:
    """Validate a YAML file into `model`; BadInput (exit 2) with one line on any problem."""
    raw = read_yaml(path)
    try:
        return model.model_validate(raw), raw
    except ValidationError as exc:
        raise BadInput(f"{path}: {describe_error(model, exc)}") from None


def load_stack_section(path: Path) -> StackSpec:
    """The `stack:` section of any spec (round trip, ladder, sweep, law, failmatrix)."""
    raw = read_yaml(path).get("stack", {})
    try:
        return StackSpec.model_validate(raw)
    except ValidationError as exc:
        raise BadInput(f"{path}: stack.{describe_error(StackSpec, exc)}") from None
