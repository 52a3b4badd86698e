"""Whether a deployment runs vLLM with ``VLLM_BATCH_INVARIANT=1``: a pure decision from the
spec and the model's ``config.json``, for the device profile to put in vLLM's environment.

What vLLM 0.32 does with it (read in its source; docs/architecture/output-oracle.md):
matmuls, softmax, log-softmax, bmm, mean and RMSNorm are replaced or pinned so a row's
result does not depend on how many rows run beside it; all-reduce is pinned to one
order; attention runs with one KV split; and only attention backends that declare
``supports_batch_invariance`` may be selected (a layer whose backend does not makes the
GPU worker raise at start-up, ``v1/worker/gpu/attn_utils.py:234-241``). Quantized linear
layers are not covered (``model_executor/layers/linear.py:235`` is the unquantized
method's). With it, a prefill of the tail over restored KV equals a full prefill's where
the KV bytes are equal (the install read-back proves they are), so the output check can ask
for bit-identical tokens on a GPU too. Where it cannot hold, it stays off and a spec that
runs there declares ``vllm.output_tolerance``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bsrctl.errors import BadInput

# Backends that declare supports_batch_invariance() in vLLM 0.32 (the base class says False,
# v1/attention/backend.py:205-207): flash_attn.py:391-393, triton_attn.py:342-344,
# flex_attention.py:125-127, mla/flashattn_mla.py:57-59, mla/triton_mla.py:123-125.
# FlashInfer and FlashMLA (dense and sparse) do not, whatever tuning they do under it.
INVARIANT_BACKENDS = frozenset(
    {"FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION", "FLASH_ATTN_MLA", "TRITON_MLA"}
)


@dataclass(frozen=True)
class BatchInvariance:
    """The decision: the environment to add to vLLM's, and why."""

    on: bool
    env: Mapping[str, str]  # {"VLLM_BATCH_INVARIANT": "1"} when on, else {}
    reason: str


def _blocker(kv_cache_dtype: str, config: Mapping[str, Any], attention_backend: str | None) -> str:
    """Why batch invariance cannot hold for this model and engine ("" if it can)."""
    quant = config.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, Mapping) else "?"
        return f"a {method}-quantized checkpoint: quantized linear layers are not covered"
    if kv_cache_dtype.startswith("fp8"):
        return f"kv_cache_dtype {kv_cache_dtype}: quantized KV is not covered"
    if "index_topk" in config:  # DeepSeek V3.2 / V4 sparse MLA: FlashMLA sparse
        return "sparse MLA (index_topk): its FlashMLA backend does not declare it"
    if attention_backend and attention_backend.upper() not in INVARIANT_BACKENDS:
        return f"attention backend {attention_backend} does not declare it"
    return ""


def batch_invariance(
    device: str,
    requested: bool | None,
    dtype: str,
    kv_cache_dtype: str,
    config: Mapping[str, Any],
    attention_backend: str | None = None,
) -> BatchInvariance:
    """``requested`` is ``vllm.batch_invariant``: True asks for it (an error where it cannot
    hold), False turns it off, None turns it on wherever it holds. ``config`` is the model's
    ``config.json``. Never on cpu: vLLM's CPU float32 is already deterministic (CPU stack facts),
    and the mode's overrides are CUDA kernels."""
    if device != "cuda":
        if requested:
            raise BadInput(
                "vllm.batch_invariant: true needs stack.device: cuda (VLLM_BATCH_INVARIANT "
                "replaces CUDA kernels; the CPU stack is already deterministic)"
            )
        return BatchInvariance(False, {}, "cpu: float32 greedy is deterministic without it")
    if requested is False:
        return BatchInvariance(False, {}, "vllm.batch_invariant: false")
    why_not = _blocker(kv_cache_dtype, config, attention_backend)
    if why_not:
        if requested:
            raise BadInput(
                f"vllm.batch_invariant: true cannot hold here: {why_not} (vLLM would refuse "
                "or not guarantee it); set it false and declare vllm.output_tolerance"
            )
        return BatchInvariance(False, {}, f"off: {why_not}; declare vllm.output_tolerance")
    how = "asked for" if requested else "on by default where it holds"
    return BatchInvariance(True, {"VLLM_BATCH_INVARIANT": "1"}, f"{how}: unquantized {dtype}")
