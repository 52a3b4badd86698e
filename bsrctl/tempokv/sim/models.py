"""Model profiles for the simulated engine: KV bytes per token from the model geometry and
step costs for one H100 PCIe (BF16), from first principles. The per-step overhead beyond
them is the one free term, calibrated so TempoKV on Llama at 100% lands on the paper's
Figure 5 (≈ 106 tok/s, ≈ 5.9 s p95 TTFT). With TTUs updated at every engine step and 5%
of outputs ending early at EOS, 1 ms gives 107.5 tok/s and 5.80 s (0 ms: 110.6, 5.53; 0.5 ms: 108.8,
5.67; 2 ms: 104.5, 6.04; 10 ms: 85.7, 8.10): `python bench/tempokv/calibrate.py`."""

from __future__ import annotations

from dataclasses import dataclass

from bsrkv.tempokv.ttu import CostModel

_HBM_BYTES_S = 2.0e12  # H100 PCIe
_BF16_FLOPS = 756e12  # dense peak
_MFU_DENSE = 0.55
_MFU_ATTN = 0.40
_KV_READ_EFF = 0.8


# GPU KV capacity under vLLM: 0.9 of an 80 GB H100 (79.2 GiB as CUDA reports it), less
# the BF16 weights and an estimated 2 GiB of activations and CUDA graphs.
_GPU_GIB = 79.2
_GPU_UTILISATION = 0.9
_ACTIVATIONS_GIB = 2.0


@dataclass(frozen=True, slots=True)
class ModelProfile:
    name: str
    kv_bytes_per_token: int  # layers × KV heads × head dim × 2 (K, V) × 2 bytes
    cost: CostModel
    gpu_kv_gib: float = 0.0  # KV capacity on the GPU (queued loads wait for room in it)


def _profile(
    name: str,
    params: float,
    layers: int,
    kv_heads: int,
    head_dim: int,
    d_model: int,
    overhead_s: float,
) -> ModelProfile:
    kv_bytes = layers * kv_heads * head_dim * 2 * 2
    cost = CostModel(
        step_base_s=2 * params / _HBM_BYTES_S + overhead_s,
        token_s=2 * params / (_BF16_FLOPS * _MFU_DENSE),
        attn_pair_s=4 * layers * d_model / (_BF16_FLOPS * _MFU_ATTN),
        decode_ctx_token_s=kv_bytes / (_HBM_BYTES_S * _KV_READ_EFF),
    )
    weights_gib = 2 * params / 2**30
    kv_gib = _GPU_GIB * _GPU_UTILISATION - weights_gib - _ACTIVATIONS_GIB
    return ModelProfile(name, kv_bytes, cost, kv_gib)


# Per-step scheduling/sampling/launch overhead beyond the first-principles terms: calibrated
# on Figure 5 (module docstring); Qwen takes the same value.
STEP_OVERHEAD_S = 0.001

_GEOMETRY = {  # params, layers, KV heads, head dim, d_model
    "llama-3.1-8b": (8.03e9, 32, 8, 128, 4096),
    "qwen2.5-14b": (14.77e9, 48, 8, 128, 5120),
}


def make_profile(name: str, step_overhead_s: float | None = None) -> ModelProfile:
    overhead_s = STEP_OVERHEAD_S if step_overhead_s is None else step_overhead_s
    return _profile(name, *_GEOMETRY[name], overhead_s=overhead_s)


CATALOGUE: dict[str, ModelProfile] = {name: make_profile(name) for name in _GEOMETRY}
