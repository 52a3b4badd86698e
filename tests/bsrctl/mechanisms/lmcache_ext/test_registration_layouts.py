"""Registrations as the engine registers them: CPU tensors built by vLLM 0.32's own
``create_kv_cache_views`` (the [B, H, N, C] per-layer views every CUDA backend gets, in the
layout each backend asks for), run through LMCache 0.5.6's own detector and kernel-group
builder, read back by the server module's ``layout.live_registration`` and compared with
``registration: auto`` (``derive``): the exact per-chunk shapes and bytes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmcache")
kvi = pytest.importorskip("vllm.v1.kv_cache_interface")

from lmcache.utils import EngineType  # noqa: E402
from lmcache.v1.gpu_connector.utils import normalize_and_discover_per_layer_formats  # noqa: E402
from lmcache.v1.kv_layer_groups import KVLayerGroupsManager  # noqa: E402
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from bsrctl.registration import derive  # noqa: E402
from bsrctl.registration.live import live_geometry  # noqa: E402
from bsrkv.lmcache_ext.server import layout  # noqa: E402

CHUNK = 256
BLOCKS = 32
LAYERS = 2

GQA_LLAMA = {  # 32 query heads, 8 KV heads of 128: TP 2 holds 4 per rank
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {  # MLA: one latent of kv_lora_rank + qk_rope_head_dim = 576 per token
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 128,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}


def vllm_views(spec: object, vllm_layout: KVCacheLayout) -> list[torch.Tensor]:
    """What vLLM 0.32's worker builds for one layer-compact KV cache tensor of LAYERS
    layers (``create_kv_cache_views``), on CPU memory."""
    page = spec.page_size_bytes
    raw = torch.zeros(page * BLOCKS * LAYERS, dtype=torch.int8)
    tensor = kvi.KVCacheTensor(
        size=raw.numel(),
        layers=[f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)],
        layer_stride=page * BLOCKS,
        block_stride=page,
    )
    return kvi.create_kv_cache_views(raw, spec, BLOCKS, vllm_layout, tensor)


def live(views: list[torch.Tensor], kv_layout: str, tp: int = 1):
    """LMCache's own detection and grouping of ``views`` (the hint vLLM's LMCache
    integration sends: ``vllm_layout_hints``), read back as the server module does."""
    normalized, formats = normalize_and_discover_per_layer_formats(
        views, [], EngineType.VLLM, {"kv_layout": kv_layout}
    )
    manager = KVLayerGroupsManager(normalized, formats, (), CHUNK)
    ctx = SimpleNamespace(kv_layer_groups_manager=manager, kv_tensors=views, num_blocks=BLOCKS)
    entry = SimpleNamespace(cache_context=ctx, model_name="m", world_size=tp)
    return layout.live_registration(0, entry, CHUNK)


def bf16_attention(block_size: int, heads: int, head_size: int):
    return kvi.FullAttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=torch.bfloat16
    )


@pytest.mark.parametrize(
    ("backend", "vllm_layout", "hint", "registered", "fmt"),
    [
        # FlashAttention: NHD (LBNHC), the default layout; blocks of 16 tokens
        ("flash_attn", KVCacheLayout.LBNHC, "NHD", [BLOCKS, 4, 16, 256], "NL_X_NB_BS_NH_CS"),
        # FlashInfer (trtllm-gen kernels, SM100): HND (LBHNC)
        ("flashinfer", KVCacheLayout.LBHNC, "HND", [BLOCKS, 4, 16, 256], "NL_X_NB_NH_BS_CS"),
    ],
)
def test_gqa_kv_as_flash_backends_register_it(backend, vllm_layout, hint, registered, fmt):
    views = vllm_views(bf16_attention(16, 4, 128), vllm_layout)
    assert [list(v.shape) for v in views] == [registered] * LAYERS  # logical [B, H, N, C]
    reg = live(views, hint, tp=2)
    assert [g.engine_kv_format for g in reg.engine_groups] == [fmt]
    assert [t.shape for t in reg.tensors] == [(2, CHUNK, 4, 128)] * LAYERS
    assert [(t.dtype, t.group) for t in reg.tensors] == [("bfloat16", 0)] * LAYERS
    want = derive.derive(GQA_LLAMA, tp_size=2, chunk_tokens=CHUNK)
    assert live_geometry(want, reg.tensors) == tuple(
        f"kv[{i}]=[2, 256, 4, 128] bfloat16 g0" for i in range(LAYERS)
    )
    assert [g.split("=", 1)[1] for g in want.geometry()] == [
        g.split("=", 1)[1] for g in live_geometry(want, reg.tensors)
    ]
    per_chunk = 2 * CHUNK * 4 * 128 * 2  # K and V, 256 tokens, 4 heads of 128, bf16
    assert want.bytes_per_chunk == LAYERS * per_chunk == 1_048_576


@pytest.mark.parametrize(
    ("vllm_layout", "hint"), [(KVCacheLayout.LBNHC, "NHD"), (KVCacheLayout.LBHNC, "HND")]
)
def test_mla_latent_as_vllm_registers_it_reads_as_the_latent(vllm_layout, hint):
    spec = kvi.MLAAttentionSpec(
        block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16
    )  # FlashMLA's 64-token blocks; head_size_v = 0: C = 576 elements
    views = vllm_views(spec, vllm_layout)
    assert [list(v.shape) for v in views] == [[BLOCKS, 1, 64, 576]] * LAYERS
    reg = live(views, hint)
    # LMCache's own reading: a fused K/V plane of one head (there is no use_mla to tell it
    # otherwise); the server module's K/V reading of it is (2, T, 1, 288)
    fmt = "NL_X_NB_BS_NH_CS" if hint == "NHD" else "NL_X_NB_NH_BS_CS"
    assert [g.engine_kv_format for g in reg.engine_groups] == [fmt]
    assert [t.shape for t in reg.tensors] == [(2, CHUNK, 1, 288)] * LAYERS
    want = derive.derive(DEEPSEEK_V3, tp_size=2, chunk_tokens=CHUNK)
    assert [t.shape for t in want.tensors] == [(CHUNK, 576)] * LAYERS
    # read against the derived registration, it is the latent: derived == live
    assert live_geometry(want, reg.tensors) == tuple(
        f"kv[{i}]=[256, 576] bfloat16 g0" for i in range(LAYERS)
    )
    assert want.bytes_per_chunk == LAYERS * CHUNK * 576 * 2 == 589_824


def test_a_one_head_kv_plane_stays_kv() -> None:
    """The tiny Llama at TP 2 (one KV head of 32 per rank) registers [B, 1, N, 64] too:
    read against its derived K/V it stays K/V, never a latent."""
    tiny = {**GQA_LLAMA, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
    views = vllm_views(bf16_attention(16, 1, 32), KVCacheLayout.LBNHC)
    reg = live(views, "NHD", tp=2)
    want = derive.derive(tiny, tp_size=2, chunk_tokens=CHUNK)
    assert [t.shape for t in want.tensors] == [(2, CHUNK, 1, 32)] * LAYERS
    assert live_geometry(want, reg.tensors) == tuple(
        f"kv[{i}]=[2, 256, 1, 32] bfloat16 g0" for i in range(LAYERS)
    )
    # and a latent of another width is shown as read (K/V), so identity names it
    mla = derive.derive({**DEEPSEEK_V3, "kv_lora_rank": 448}, chunk_tokens=CHUNK)
    assert live_geometry(mla, reg.tensors)[0] == "kv[0]=[2, 256, 1, 32] bfloat16 g0"


def test_dsa_indexer_plane_is_detected_apart() -> None:
    """vLLM >= 0.29 allocates the DSA indexer cache through the MLA spec: uint8 rows of 132
    (128 fp8 + one fp32 scale); LMCache squeezes the head axis and reads one 132-wide row per
    slot (NL_X_NB_BSV_BSS): 256 x 132 = 33,792 B per 256-token chunk per layer."""
    spec = kvi.MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype=torch.uint8)
    views = vllm_views(spec, KVCacheLayout.LBNHC)
    assert [list(v.shape) for v in views] == [[BLOCKS, 1, 64, 132]] * LAYERS
    reg = live(views, "NHD")
    assert [g.engine_kv_format for g in reg.engine_groups] == ["NL_X_NB_BSV_BSS"]
    assert [(t.shape, t.dtype) for t in reg.tensors] == [((CHUNK, 132), "uint8")] * LAYERS
