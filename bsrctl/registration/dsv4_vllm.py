"""DeepSeek-V4's registration as vLLM 0.32's own code computes it, on CPU, no weights: the
check ``bsrctl.registration.dsv4`` (the mirror ``registration: auto`` uses) is tested against.

What is vLLM's: the VllmConfig from the model folder, the CUDA attention class vLLM picks
(``_select_dsv4_attn_cls``, models/deepseek_v4/nvidia/model.py:1013; no device capability
here, so FlashMLA, the SM90/SM100 default), every layer it builds with its caches
(attention.py:195-372), their ``get_kv_cache_spec``, the block size the platform picks for
those backends (platforms/interface.py:700-745), the layout (v1/attention/backends/utils.py:
209-349) and the KV cache groups (v1/core/kv_cache_utils.py:2159).

What is stood in, none of it in a KV cache spec: the weights' quantization (vLLM's CPU
kernels refuse FP8 linears without AMX), ``torch.cuda.Event`` (vLLM's own CPU stand-in
``_NoOpEvent``), FlashMLA's o_proj einsum recipe (needs a CUDA device), and a 1-rank gloo
group: every DSV4 cache has ``max_tp_shards = 1``, so each of TP ranks holds the same ones.

It initialises torch.distributed, so run it in its own process: ``python -m
bsrctl.registration.dsv4_vllm FOLDER [KV_CACHE_DTYPE]`` prints the specs and groups as JSON.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

from bsrkv.registration import DTYPE_BYTES, GroupSpec, Registration, TensorSpec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_specs(folder: Path, kv_cache_dtype: str = "auto") -> dict[str, Any]:
    """Per registered cache, in registration order, vLLM's spec; and vLLM's KV cache groups."""
    import torch
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.config.cache import CacheConfig
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups

    mc = ModelConfig(model=str(folder), skip_tokenizer_init=True, max_model_len=8192)
    vc = VllmConfig(
        model_config=mc,
        parallel_config=ParallelConfig(tensor_parallel_size=1),
        cache_config=CacheConfig(cache_dtype=kv_cache_dtype),  # type: ignore[arg-type]
    )
    vc.quant_config = None  # weights only
    with set_current_vllm_config(vc):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend="gloo",
        )
        initialize_model_parallel(1)
        import vllm.models.deepseek_v4.nvidia.flashmla as flashmla
        from vllm.models.deepseek_v4.cpu.cpu_sparse import _NoOpEvent
        from vllm.models.deepseek_v4.nvidia.model import _select_dsv4_attn_cls

        torch.cuda.Event = _NoOpEvent  # type: ignore[misc,assignment]
        flashmla.compute_fp8_einsum_recipe = lambda: (None, None)  # type: ignore[assignment]
        attn_cls = _select_dsv4_attn_cls(vc)
        n = int(mc.hf_config.num_hidden_layers)
        with torch.device("meta"):
            kept = [attn_cls(vc, prefix=f"model.layers.{i}.attn") for i in range(n)]
        backends = Platform._find_non_ssm_backends(vc)
        vc.cache_config.block_size = Platform._preferred_block_size_for_backends(
            backends, CacheConfig.DEFAULT_BLOCK_SIZE, vc
        )
        layers = get_layers_from_vllm_config(vc, AttentionLayerBase)  # type: ignore[type-abstract]
        specs = {k: s for k, layer in layers.items() if (s := layer.get_kv_cache_spec(vc))}
        layouts = [x.name for x in get_supported_kv_cache_layouts(backends)]
        layout = resolve_kv_cache_layout(vc, [layouts], list(specs.values()))
        groups = get_kv_cache_groups(vc, specs)
    del kept
    return {
        "folder": str(folder),
        "attention_class": attn_cls.__name__,
        "block_size": vc.cache_config.block_size,
        "cache_dtype": vc.cache_config.cache_dtype,
        "layout": layout.name,
        "specs": [
            {
                "name": k,
                "class": type(s).__name__,
                "block_size": s.block_size,
                "num_kv_heads": s.num_kv_heads,
                "max_tp_shards": s.max_tp_shards,
                "head_size": s.head_size,
                "dtype": str(s.dtype).removeprefix("torch."),
                "num_states": s.num_states,
                "state_content_size_bytes": s.state_content_size_bytes,
                "page_size_bytes": s.page_size_bytes,
                "real_page_size_bytes": s.real_page_size_bytes,
                "tokens_per_state": int(s.tokens_per_state),
                "sliding_window": getattr(s, "sliding_window", None),
                "model_version": getattr(s, "model_version", None),
            }
            for k, s in specs.items()
        ],
        "groups": [
            {"layers": list(g.layer_names), "block_size": _first(g.kv_cache_spec).block_size}
            for g in groups
        ],
    }


def registration(
    doc: dict[str, Any], *, tp_size: int, chunk_tokens: int, separate_object_groups: bool = False
) -> Registration:
    """``vllm_specs``' caches as a registration: per cache ``(T * N / block, C)`` of its dtype
    (C = state_content_size_bytes, the registered view's row; its bytes are vLLM's unpadded
    page per chunk), grouped as LMCache buckets kernel groups (lmcache/v1/kv_layer_groups.py:
    666-722): one object group, or with separate object groups by window in chunks, in the
    order of each bucket's first tensor."""
    rows: list[tuple[str, tuple[int, int], str, int]] = []
    for s in doc["specs"]:
        per = DTYPE_BYTES[s["dtype"]]
        states = chunk_tokens * s["num_states"] // s["block_size"]
        shape = (states, s["state_content_size_bytes"] // per)
        if states * shape[1] * per != s["real_page_size_bytes"] * chunk_tokens // s["block_size"]:
            raise ValueError(f"{s['name']}: {shape} is not vLLM's unpadded page per chunk")
        window = s["sliding_window"]
        span = -(-window // chunk_tokens) if window else -1
        rows.append((s["name"], shape, s["dtype"], span if separate_object_groups else -1))
    index: dict[int, int] = {}
    for *_, span in rows:
        index.setdefault(span, len(index))
    groups = tuple(
        GroupSpec(
            i,
            "attention"
            if span == -1 and len(index) == 1
            else "compressed"
            if span == -1
            else "sliding_window",
            span,
        )
        for span, i in index.items()
    )
    tensors = tuple(TensorSpec(n, shape, dt, index[span]) for n, shape, dt, span in rows)
    return Registration(
        Path(doc["folder"]).name, tensors, groups, tp_size, chunk_tokens,
        engine_groups=len(doc["groups"]),
    )  # fmt: skip


def _first(spec: Any) -> Any:
    return getattr(spec, "first_spec", spec)


if __name__ == "__main__":
    dtype = sys.argv[2] if len(sys.argv) > 2 else "auto"
    print(json.dumps(vllm_specs(Path(sys.argv[1]), dtype)))
