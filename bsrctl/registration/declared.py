"""Declared registrations: a registration written in YAML (a file, or inline in a spec).

    model: my-model@tp2
    chunk_tokens: 256        # must equal the deployment's stack.lmcache.chunk_size
    tp_size: 2               # must equal the deployment's TP size
    aux_bytes: 0             # restore-pool bytes per rank beyond W*c (a spec's aux_bytes wins)
    groups:
      - {index: 0, name: attention}                    # sliding_window_chunks: -1 (full)
    tensors:                 # per rank, per chunk, in registration order; "T" = chunk_tokens
      - {name: aux.state, shape: [T, 4640], dtype: bfloat16, group: 0}
      - layers: [0, 43]      # a block repeated for i in range(0, 43), {i} in names
        tensors:
          - {name: "layers.{i}.attn.kv_latent", shape: [T, 512], dtype: bfloat16, group: 0}

The paper's DeepSeek-V4-Flash registrations are such files under ``ladders/registrations/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from bsrctl.errors import BadInput
from bsrctl.spec_io import Strict, describe_error, read_yaml
from bsrkv.registration import DTYPE_BYTES, GroupSpec, Registration, TensorSpec


class TensorDecl(Strict):
    name: str = Field(min_length=1)
    shape: list[int | Literal["T"]] = Field(min_length=1, description='"T": tokens per chunk')
    dtype: str
    group: int = Field(0, ge=0)


class LayerBlock(Strict):
    layers: tuple[int, int] = Field(description="[start, stop): the block repeats per layer")
    tensors: list[TensorDecl] = Field(min_length=1)


class GroupDecl(Strict):
    index: int = Field(ge=0)
    name: str = Field(min_length=1)
    sliding_window_chunks: int = Field(-1, description="-1 full attention; >= 1 sliding")


class RegistrationDecl(Strict):
    model: str = Field(min_length=1)
    chunk_tokens: int = Field(gt=0)
    tp_size: int = Field(1, ge=1)
    aux_bytes: int = Field(0, ge=0)
    groups: list[GroupDecl] = Field(min_length=1)
    tensors: list[TensorDecl | LayerBlock] = Field(min_length=1)

    def build(self) -> Registration:
        t = self.chunk_tokens
        out: list[TensorSpec] = []

        def one(d: TensorDecl, i: int | None) -> TensorSpec:
            shape = tuple(t if s == "T" else s for s in d.shape)
            name = d.name.format(i=i) if i is not None else d.name
            return TensorSpec(name, shape, d.dtype, d.group)

        for item in self.tensors:
            if isinstance(item, LayerBlock):
                out += [one(d, i) for i in range(*item.layers) for d in item.tensors]
            else:
                out.append(one(item, None))
        groups = tuple(GroupSpec(g.index, g.name, g.sliding_window_chunks) for g in self.groups)
        return Registration(self.model, tuple(out), groups, self.tp_size, t, self.aux_bytes)


def parse(doc: Any, where: str) -> Registration:
    """A declared registration from its YAML mapping; BadInput naming the field."""
    if not isinstance(doc, dict):
        raise BadInput(f"{where}: a registration is a mapping (model, chunk_tokens, tensors...)")
    try:
        decl = RegistrationDecl.model_validate(doc)
    except ValidationError as exc:
        raise BadInput(f"{where}.{describe_error(RegistrationDecl, exc)}") from None
    for d in _decls(decl):
        if d.dtype not in DTYPE_BYTES:
            raise BadInput(
                f"{where}.tensors: {d.name} has dtype {d.dtype!r}; use one of {sorted(DTYPE_BYTES)}"
            )
    try:
        return decl.build()
    except ValueError as exc:
        raise BadInput(f"{where}: {exc}") from None


def _decls(decl: RegistrationDecl) -> list[TensorDecl]:
    return [
        d
        for item in decl.tensors
        for d in (item.tensors if isinstance(item, LayerBlock) else [item])
    ]


def load(path: Path) -> Registration:
    """A declared registration from a YAML file."""
    return parse(read_yaml(Path(path)), f"registration {path}")
