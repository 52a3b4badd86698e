"""``registration: auto`` for DeepSeek-V4 (``DeepseekV4ForCausalLM``): the KV cache tensors
vLLM 0.32 registers per layer, as a pure function of ``config.json`` (plans off a vLLM
install). ``bsrctl.registration.dsv4_vllm`` computes the same from vLLM's own layer objects;
tests/bsrctl/registration/test_dsv4.py checks the two agree to the byte.

vLLM 0.32 on CUDA, default attention backend (FlashMLA sparse on SM90/SM100:
models/deepseek_v4/nvidia/model.py:1013-1045), per layer ``i`` of ``num_hidden_layers``
with ``r = max(1, compress_ratios[i])`` (models/deepseek_v4/attention.py:232-235), in the
order the layers register (their static_forward_context order):

- r == 4: the indexer's key cache ``{p}.indexer.k_cache``, MLAAttentionSpec, 132-byte rows
  (128 fp8 + 4 fp32 scale, attention.py:1009-1019), one state per 4 tokens
  (attention.py:907-920), then its compressor state ``{p}.indexer.compressor.state_cache``
  (compressor.py:282-287: 2 * coff * 128 float32, coff = 2 for r = 4), a 2r-token window;
- ``{p}.swa_cache``: DeepseekV4SWACache, SlidingWindowMLASpec, window ``sliding_window``
  tokens, one 584-byte fp8_ds_mla state per token (v1/attention/backends/mla/
  sparse_swa.py:116-140; 448 B NoPE + 128 B RoPE + 8 B scale);
- r > 1: the compressed latent ``{p}`` (attention.py:856-880), one 584-byte state per r
  tokens, and the compressor state ``{p}.compressor.state_cache``: 2 * coff * 512 float32
  (coff = 2 at r = 4, 1 at r = 128), window coff * r tokens (compressor.py:139-198).

``p`` is ``model.layers.{i}.attn``. Every cache is one latent (num_kv_heads = 1,
max_tp_shards = 1): TP ranks hold replicas, so each rank registers all of them. The KV
cache dtype is fp8_ds_mla for ``auto`` and every fp8 spelling (attention.py:93-128);
FlashMLA refuses bf16/fp16 caches.

Bytes per chunk: the registered view of a layer is ``[B, H, N, C]`` with C the state's bytes
(v1/kv_cache_interface.py:319-335, 377-416), which LMCache copies slot by slot; the page
padding vLLM adds to a 576-byte multiple (kv_cache_interface.py:676-683) lies between blocks
and is not part of an object. So a layer's slice of a chunk of T tokens is
``(T // tokens_per_state, C)``.

Groups mirror LMCache's object groups (lmcache/v1/kv_layer_groups.py:666-722): one object
group for every layer by default; with ``--separate-object-groups`` the kernel groups bucket
by sliding window in chunks, ordered by their first registered tensor: here the windows
(128, 8 and 128 tokens) all round up to one chunk, so group 0 is the sliding-window caches
(span 1 chunk) and group 1 the compressed latents and indexer keys (full attention).

vLLM itself groups these caches into 5 KV cache groups (v1/core/kv_cache_utils.py:
1860-1995, block-outermost BLHNC): the SWA caches of even and of odd layers, the compressed
latents with the indexer keys, the r = 4 and the r = 128 compressor states. The block size
of the compressed group is 256 tokens (the FlashMLA and indexer backends' only kernel block
size, sparse_mla.py:60-61, indexer.py:355-357), so LMCache's chunk must be a multiple of it
(kv_layer_groups.py:724-760).

``dsv4_flash_mtp_off`` beside it is the BSR paper's registration of the same model: its
tensor count and bytes per chunk, with illustrative shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bsrctl.errors import BadInput
from bsrkv.registration import DTYPE_BYTES, GroupSpec, Registration, TensorSpec

ARCH = "DeepseekV4ForCausalLM"
FP8_DS_MLA_BYTES = 584  # per state: 448 NoPE fp8 + 64 RoPE bf16 + 8 scale (attention.py:877)
INDEXER_ROW_BYTES = 132  # 128 fp8 + 128 // 128 * 4 fp32 scale (attention.py:1009-1014)
COMPRESSED_BLOCK_TOKENS = 256  # the compressed group's vLLM block size
VLLM_KV_CACHE_GROUPS = 5  # what get_kv_cache_groups makes of this model (see above)
FP8_CACHES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class Cache:
    """One registered KV cache of one layer: its per-state row and what it spans."""

    name: str
    row_bytes: int  # C of the registered [B, H, N, C] view
    dtype: str
    tokens_per_state: int
    window_tokens: int  # -1: full attention

    def tensor(self, chunk_tokens: int, group: int) -> TensorSpec:
        per = DTYPE_BYTES[self.dtype]
        return TensorSpec(
            self.name,
            (chunk_tokens // self.tokens_per_state, self.row_bytes // per),
            self.dtype,
            group,
        )


def layer_caches(config: Mapping[str, Any]) -> list[Cache]:
    """Every KV cache vLLM 0.32 registers for this config, in registration order."""
    window = int(config["sliding_window"])
    index_dim = int(config["index_head_dim"])
    head = int(config["head_dim"])
    ratios = list(config["compress_ratios"])
    out: list[Cache] = []
    for i in range(int(config["num_hidden_layers"])):
        p, r = f"model.layers.{i}.attn", max(1, int(ratios[i]))
        coff = 1 + (r == 4)
        if r == 4:  # only C4 layers have the sparse indexer (attention.py:298)
            row = index_dim + index_dim // 128 * 4
            out.append(Cache(f"{p}.indexer.k_cache", row, "uint8", r, -1))
            out.append(
                Cache(
                    f"{p}.indexer.compressor.state_cache",
                    2 * coff * index_dim * 4,
                    "float32",
                    1,
                    coff * r,
                )
            )
        out.append(Cache(f"{p}.swa_cache", FP8_DS_MLA_BYTES, "uint8", 1, window))
        if r > 1:
            out.append(Cache(p, FP8_DS_MLA_BYTES, "uint8", r, -1))
            out.append(
                Cache(f"{p}.compressor.state_cache", 2 * coff * head * 4, "float32", 1, coff * r)
            )
    return out


def derive_dsv4(
    config: Mapping[str, Any],
    *,
    tp_size: int,
    chunk_tokens: int,
    kv_cache_dtype: str = "auto",
    name: str = "",
    separate_object_groups: bool = False,
) -> Registration:
    """The per-rank, per-chunk registration of a DeepSeek-V4 config, grouped as LMCache's
    server stores it."""
    if kv_cache_dtype not in FP8_CACHES:
        raise BadInput(
            f"stack.vllm.kv_cache_dtype: {kv_cache_dtype!r}: DeepSeek-V4's FlashMLA backend "
            f"keeps an fp8_ds_mla cache only (vllm/models/deepseek_v4/attention.py:106-116); "
            f"use auto or fp8"
        )
    if chunk_tokens % COMPRESSED_BLOCK_TOKENS:
        raise BadInput(
            f"stack.lmcache.chunk_size: {chunk_tokens} is not a multiple of "
            f"{COMPRESSED_BLOCK_TOKENS}, DeepSeek-V4's compressed KV block, which LMCache "
            f"refuses (lmcache/v1/kv_layer_groups.py: tokens_per_block); use 256 or a multiple"
        )
    caches = layer_caches(config)
    if separate_object_groups:
        span = -(-max(c.window_tokens for c in caches) // chunk_tokens)
        groups = (GroupSpec(0, "sliding_window", span), GroupSpec(1, "compressed"))
        tensors = tuple(c.tensor(chunk_tokens, 0 if c.window_tokens > 0 else 1) for c in caches)
    else:
        groups = (GroupSpec(0, "attention"),)
        tensors = tuple(c.tensor(chunk_tokens, 0) for c in caches)
    prefix = name or str(config.get("_name_or_path") or ARCH)
    return Registration(
        prefix, tensors, groups, tp_size, chunk_tokens, engine_groups=VLLM_KV_CACHE_GROUPS
    )


# ---- the paper's geometry ------------------------------------------------------------

PAPER_BYTES_PER_CHUNK = 16_408_576  # DeepSeek-V4-Flash MTP-off, 256-token chunks, per rank
PAPER_NUM_TENSORS = 167


def dsv4_flash_mtp_off(tp_size: int = 2, chunk_tokens: int = 256) -> Registration:
    """The paper's figure: 167 tensors, 16,408,576 bytes per 256-token chunk per rank. It is
    the paper's number (storage-stack runs at paper geometry, the report's "paper's figure"
    line), not what vLLM 0.32 registers for DeepSeek-V4-Flash (``registration: auto``,
    ``derive_dsv4`` above: also 167 tensors, other shapes and bytes).

    The paper gives the tensor count and c, not the shapes; these are illustrative shapes
    chosen to sum exactly (so W = 32 gives 500.75 MiB per rank per window, and a 1024-chunk
    whole plan 16,802,381,824 bytes, the paper's measured 256K L1 peak):
      43 layers x kv latent (T, 512) bf16 + rope key (T, 64) bf16        group 0 attention
      40 layers x indexer key (T, 128) fp8 (as uint8) + scale (T,) f32    group 1 indexer
      1 x aux state (T, 4640) bf16                                         group 2 aux
    with T = 256 tokens per chunk. ``chunk_tokens`` other than 256 scales every T.
    """
    t = chunk_tokens
    tensors: list[TensorSpec] = []
    for i in range(43):
        tensors.append(TensorSpec(f"layers.{i}.attn.kv_latent", (t, 512), "bfloat16", 0))
        tensors.append(TensorSpec(f"layers.{i}.attn.k_rope", (t, 64), "bfloat16", 0))
    for i in range(3, 43):
        tensors.append(TensorSpec(f"layers.{i}.attn.indexer_k", (t, 128), "uint8", 1))
        tensors.append(TensorSpec(f"layers.{i}.attn.indexer_k_scale", (t,), "float32", 1))
    tensors.append(TensorSpec("aux.hc_state", (t, 4640), "bfloat16", 2))
    groups = (GroupSpec(0, "attention"), GroupSpec(1, "indexer"), GroupSpec(2, "aux"))
    return Registration("deepseek-v4-flash-mtp-off", tuple(tensors), groups, tp_size, chunk_tokens)
