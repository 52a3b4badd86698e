"""``registration: auto``: the per-rank, per-chunk KV tensors vLLM registers, from a model
folder's ``config.json`` and the serving settings (TP size, chunk size, dtypes).

What vLLM 0.32 registers, one tensor per attention layer, in layer order, named by the
layer (``model.layers.{i}.self_attn.attn``):

- full attention, MHA and GQA: K and V of the rank's KV heads, per chunk
  ``(2, T, kv_heads_per_rank, head_dim)``. KV heads are split across TP ranks; with fewer
  KV heads than ranks each rank holds one (replicated), as vLLM does.
- MLA (DeepSeek-V2/V3): one latent per layer ``(T, kv_lora_rank + qk_rope_head_dim)``,
  the same on every rank (not split by TP).
- sliding-window layers: LMCache stores every layer of a chunk in one object group unless
  its server runs with ``--separate-object-groups`` (``stack.lmcache.separate_object_groups``);
  then each window size is its own group, spanning ceil(window / chunk) chunks, groups in the
  order of their first layer (LMCache buckets kernel groups so), and BSR leaves a request
  with a sliding-window group to LMCache's stock path.
- KV cache dtype: ``auto`` is the model's dtype; ``fp8``/``fp8_e4m3``/``fp8_e5m2`` caches are
  stored as ``uint8`` (vLLM allocates fp8 caches as bytes), 1 B per element.

- DeepSeek-V4 (``DeepseekV4ForCausalLM``): sliding-window, compressed and compressor-state
  latents per layer, ``bsrctl.registration.dsv4``.

An architecture not listed here is BadInput naming it: declare its registration in YAML.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bsrctl.errors import BadInput
from bsrctl.registration import dsv4
from bsrkv.registration import GroupSpec, Registration, TensorSpec

# Architectures whose attention is plain MHA/GQA (per layer K and V).
FULL_ATTENTION = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Phi3ForCausalLM",
        "GraniteForCausalLM",
    }
)
# Architectures with Multi-head Latent Attention (one compressed latent per layer).
MLA = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})
KNOWN = FULL_ATTENTION | MLA

# vLLM's --dtype / kv_cache_dtype spellings → the torch dtype its cache tensors have.
MODEL_DTYPES = {
    "float32": "float32",
    "float": "float32",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
}
FP8_CACHE = {"fp8", "fp8_e4m3", "fp8_e5m2"}
CUSTOM_HINT = (
    "declare its registration instead: `registration: path/to/registration.yaml` "
    "(tensors with shape, dtype and group; see ladders/registrations/)"
)


def cache_dtype(config: Mapping[str, Any], dtype: str, kv_cache_dtype: str) -> str:
    """The torch dtype of the KV cache vLLM allocates: fp8 caches as uint8, ``auto`` as the
    model dtype (the serving ``dtype`` setting, or config.json's when that is ``auto``)."""
    if kv_cache_dtype in FP8_CACHE:
        return "uint8"
    if kv_cache_dtype != "auto":
        if kv_cache_dtype not in MODEL_DTYPES:
            raise BadInput(
                f"stack.vllm.kv_cache_dtype: {kv_cache_dtype!r} is not one of "
                f"auto, {', '.join(sorted(FP8_CACHE | set(MODEL_DTYPES)))}"
            )
        return MODEL_DTYPES[kv_cache_dtype]
    if dtype != "auto":
        if dtype not in MODEL_DTYPES:
            raise BadInput(f"stack.vllm.dtype: {dtype!r} is not auto or {sorted(MODEL_DTYPES)}")
        return MODEL_DTYPES[dtype]
    named = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    got = MODEL_DTYPES.get(str(named).removeprefix("torch."))
    if got is None:
        raise BadInput(f"config.json: torch_dtype {named!r} is not one of {sorted(MODEL_DTYPES)}")
    # vLLM's `auto` serves float32 checkpoints in half precision on GPUs; bsrctl's CPU stack
    # passes --dtype float32 explicitly, so `auto` here follows vLLM's GPU rule.
    return "bfloat16" if got == "float32" else got


def layer_kinds(config: Mapping[str, Any], layers: int) -> list[str]:
    """ "full" or "sliding" per layer: config's ``layer_types`` when given, else HF's rules
    (Gemma-2's every other layer; ``use_sliding_window`` from ``max_window_layers`` on)."""
    if types := config.get("layer_types"):
        if len(types) != layers:
            raise BadInput(f"config.json: {len(types)} layer_types for {layers} layers")
        return ["sliding" if "sliding" in str(t) else "full" for t in types]
    window = config.get("sliding_window")
    if not window:
        return ["full"] * layers
    if config.get("model_type") == "gemma2":
        return ["sliding" if i % 2 == 0 else "full" for i in range(layers)]
    # HF's Qwen configs default use_sliding_window to false; Mistral's window covers every layer
    qwen = str(config.get("model_type", "")).startswith(("qwen2", "qwen3"))
    if not config.get("use_sliding_window", not qwen):
        return ["full"] * layers
    first = int(config.get("max_window_layers", 0) or 0)
    return ["sliding" if i >= first else "full" for i in range(layers)]


def derive(
    config: Mapping[str, Any],
    *,
    tp_size: int = 1,
    chunk_tokens: int = 256,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    name: str = "",
    tp_field: str = "stack.vllm.tensor_parallel_size",
    separate_object_groups: bool = False,
) -> Registration:
    """The registration vLLM makes for this config on one of ``tp_size`` ranks, grouped as
    LMCache's server stores it."""
    archs = list(config.get("architectures") or [])
    arch = next((a for a in archs if a in KNOWN), None)
    if dsv4.ARCH in archs:  # its own caches and groups (bsrctl.registration.dsv4)
        return dsv4.derive_dsv4(
            config,
            tp_size=tp_size,
            chunk_tokens=chunk_tokens,
            kv_cache_dtype=kv_cache_dtype,
            name=name,
            separate_object_groups=separate_object_groups,
        )
    if arch is None:
        shown = ", ".join(archs) or f"model_type {config.get('model_type')!r}"
        raise BadInput(f"registration: auto does not know the architecture {shown}; {CUSTOM_HINT}")
    layers = int(config["num_hidden_layers"])
    t, dt = chunk_tokens, cache_dtype(config, dtype, kv_cache_dtype)
    prefix = name or str(config.get("_name_or_path") or arch)
    if arch in MLA:
        width = int(config["kv_lora_rank"]) + int(config["qk_rope_head_dim"])
        tensors = tuple(
            TensorSpec(f"model.layers.{i}.self_attn.attn", (t, width), dt, 0) for i in range(layers)
        )
        return Registration(prefix, tensors, (GroupSpec(0, "attention"),), tp_size, t)
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    if (kv_heads % tp_size if kv_heads >= tp_size else tp_size % kv_heads) or heads % tp_size:
        raise BadInput(
            f"{tp_field}: {tp_size} does not divide the {kv_heads} KV heads of {arch} (nor "
            f"is it a multiple of them, with {heads} query heads); vLLM refuses it"
        )
    per_rank = max(1, kv_heads // tp_size)  # fewer KV heads than ranks: replicated
    kinds = layer_kinds(config, layers)
    if not separate_object_groups:
        kinds = ["full"] * layers  # one object group holds every layer of a chunk
    span = math.ceil(int(config.get("sliding_window") or 0) / t)
    group_of: dict[str, int] = {}
    for k in kinds:  # in the order of each kind's first layer
        group_of.setdefault(k, len(group_of))
    groups = [
        GroupSpec(i, "attention") if k == "full" else GroupSpec(i, "sliding_window", span)
        for k, i in group_of.items()
    ]
    tensors = tuple(
        TensorSpec(f"model.layers.{i}.self_attn.attn", (2, t, per_rank, head_dim), dt, group_of[k])
        for i, k in enumerate(kinds)
    )
    return Registration(prefix, tensors, tuple(groups), tp_size, t)


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of a model folder; BadInput naming the file when unreadable."""
    path = Path(folder) / "config.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"stack.vllm.model: cannot read {path} ({exc})") from None
    if not isinstance(doc, dict):
        raise BadInput(f"stack.vllm.model: {path} is not a JSON object")
    return doc


def derive_from_folder(
    folder: Path,
    *,
    tp_size: int,
    chunk_tokens: int,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    tp_field: str = "stack.vllm.tensor_parallel_size",
    separate_object_groups: bool = False,
) -> Registration:
    """``derive`` over ``folder/config.json``, named after the folder."""
    return derive(
        read_config(folder),
        tp_size=tp_size,
        chunk_tokens=chunk_tokens,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        name=Path(folder).name,
        tp_field=tp_field,
        separate_object_groups=separate_object_groups,
    )
