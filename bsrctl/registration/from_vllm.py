"""The registration as vLLM 0.32's own code computes it from a model folder's ``config.json``
(no weights, CPU-safe, offline): the check ``registration: auto`` (``derive``) is tested
against, where vLLM is installed.

What is vLLM's and what is mirrored here:

- vLLM's: ``ModelConfig(model=folder, skip_tokenizer_init=True)`` reads the config (no
  weights, no tokenizer) and gives ``get_num_layers``, ``get_num_kv_heads`` (KV heads per TP
  rank, at least 1), ``get_head_size`` (``kv_lora_rank + qk_rope_head_dim`` for MLA),
  ``use_mla``, ``get_sliding_window`` and the model dtype (``vllm/config/model.py``); the
  cache dtype is ``kv_cache_dtype_str_to_dtype`` (``vllm/utils/torch_utils.py:533``, fp8
  caches as uint8); the per-layer specs are vLLM's ``FullAttentionSpec`` /
  ``SlidingWindowSpec`` / ``MLAAttentionSpec`` (``vllm/v1/kv_cache_interface.py``), whose
  ``page_size_bytes`` gives the bytes of a block and ``create_kv_cache_views`` the
  ``[B, H, N, C]`` view each layer is registered with.
- Mirrored: which spec a layer gets. vLLM's ``Attention.get_kv_cache_spec``
  (``vllm/model_executor/layers/attention/attention.py:606-660``) runs on a built model;
  here a layer is sliding where ``hf_text_config.layer_types`` says so, else every layer
  takes ``get_sliding_window()`` (Mistral), and MLA models take ``MLAAttentionSpec`` with
  one KV head (``max_tp_shards=1``: every rank holds the whole latent).

Per chunk of ``chunk_tokens`` the layer's bytes are ``page_size_bytes * chunk / block``;
its shape is written in ``derive``'s convention, ``(2, T, H, head_size)`` for K and V
(C = head_size + head_size_v, packed) and ``(T, C)`` for a latent, and checked to hold
exactly those bytes. All layers are one object group (LMCache's default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bsrkv.registration import GroupSpec, Registration, TensorSpec

BLOCK_SIZE = 16  # vLLM's default --block-size on CUDA; per-chunk figures do not depend on it


def layer_specs(
    folder: Path, *, tp_size: int, dtype: str = "auto", kv_cache_dtype: str = "auto"
) -> list[Any]:
    """vLLM's KV cache spec of every attention layer, in layer order, on one TP rank."""
    import torch
    from vllm.config import ModelConfig, ParallelConfig
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    mc = ModelConfig(model=str(folder), skip_tokenizer_init=True, dtype=dtype)
    par = ParallelConfig(tensor_parallel_size=tp_size)
    cache: torch.dtype = kv_cache_dtype_str_to_dtype(kv_cache_dtype, mc)
    layers, head = mc.get_num_layers(par), mc.get_head_size()
    if mc.use_mla:
        spec = MLAAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, max_tp_shards=1, head_size=head, dtype=cache
        )
        return [spec] * layers
    heads = mc.get_num_kv_heads(par)
    types = getattr(mc.hf_text_config, "layer_types", None)
    window = mc.get_sliding_window()
    out: list[Any] = []
    for i in range(layers):
        sliding = "sliding" in str(types[i]) if types else window is not None
        kw = {"block_size": BLOCK_SIZE, "num_kv_heads": heads, "head_size": head, "dtype": cache}
        out.append(
            SlidingWindowSpec(sliding_window=window, **kw) if sliding else FullAttentionSpec(**kw)
        )
    return out


def per_chunk_tensor(spec: Any, chunk_tokens: int, name: str) -> TensorSpec:
    """One layer's slice of a chunk, in ``derive``'s convention, holding exactly the bytes
    vLLM's pages of ``chunk_tokens`` tokens hold."""
    dtype = str(spec.dtype).removeprefix("torch.")
    if spec.head_size_v == 0:  # MLA: one latent per token
        shape: tuple[int, ...] = (chunk_tokens, spec.head_size)
    elif spec.head_size_v == spec.head_size:
        shape = (2, chunk_tokens, spec.num_heads, spec.head_size)
    else:
        raise ValueError(f"{name}: K {spec.head_size} and V {spec.head_size_v} differ")
    tensor = TensorSpec(name, shape, dtype, 0)
    page_bytes = spec.page_size_bytes * chunk_tokens // spec.block_size
    if tensor.nbytes != page_bytes or chunk_tokens % spec.block_size:
        raise ValueError(f"{name}: {shape} {dtype} is {tensor.nbytes} B, vLLM's pages {page_bytes}")
    return tensor


def vllm_registration(
    folder: Path,
    *,
    tp_size: int,
    chunk_tokens: int,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
) -> Registration:
    """The per-rank, per-chunk registration vLLM 0.32 computes for ``folder``, one group."""
    specs = layer_specs(folder, tp_size=tp_size, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    tensors = tuple(
        per_chunk_tensor(s, chunk_tokens, f"model.layers.{i}.self_attn.attn")
        for i, s in enumerate(specs)
    )
    return Registration(
        Path(folder).name, tensors, (GroupSpec(0, "attention"),), tp_size, chunk_tokens
    )
