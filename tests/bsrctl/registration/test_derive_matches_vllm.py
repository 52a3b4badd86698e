"""``registration: auto`` (``derive``) agrees with the registration vLLM 0.32's own code
computes from the same ``config.json`` (``from_vllm``: vLLM's ModelConfig and KV cache spec
classes, no weights), tensor by tensor and to the byte, for every architecture both cover:
the tiny Llama, a GQA Llama, an MLA DeepSeek-V2, sliding-window Gemma-2 and Mistral."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a bare config.json folder: nothing to fetch
pytest.importorskip("vllm.config")

from bsrctl.registration import derive  # noqa: E402
from bsrctl.registration.from_vllm import layer_specs, vllm_registration  # noqa: E402
from bsrctl.registration.tiny import TINY_QWEN3, TinyModelRecipe  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data" / "registration"
CONFIGS = ["gqa-llama", "deepseek-v2-lite", "gemma2-sliding", "mistral-sliding"]


@pytest.fixture(scope="module", autouse=True)
def _inspect_in_process():
    """vLLM inspects a model class in a fresh interpreter (model_executor/models/registry.py:
    1078-1081: to keep CUDA out of the caller); on CPU the same ``_ModelInfo`` comes from this
    process at once instead of ~20 s of imports per architecture on a cold cache."""
    from vllm.model_executor.models import registry

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_run_in_subprocess", lambda fn: fn())
        yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name in CONFIGS:
        (root / name).mkdir()
        shutil.copy(DATA / f"{name}.json", root / name / "config.json")
        out[name] = root / name
    for name, recipe in (("tiny-llama", TinyModelRecipe()), ("tiny-qwen3", TINY_QWEN3)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(recipe.hf_config()))
        out[name] = root / name
    return out


CASES = [
    (name, tp, dtype, kv)
    for name in ["tiny-llama", "tiny-qwen3", *CONFIGS]
    for tp in (1, 2)
    for dtype, kv in (("bfloat16", "auto"), ("float32", "auto"), ("bfloat16", "fp8"))
    if dtype == "bfloat16" or name.startswith("tiny")  # float32: the CPU stack's tiny models
]


@pytest.mark.parametrize(("name", "tp", "dtype", "kv"), CASES)
def test_derive_equals_vllm(folders, name: str, tp: int, dtype: str, kv: str) -> None:
    how = {"tp_size": tp, "chunk_tokens": 256, "dtype": dtype, "kv_cache_dtype": kv}
    ours = derive.derive_from_folder(folders[name], **how)
    theirs = vllm_registration(folders[name], **how)
    assert ours.geometry() == theirs.geometry()
    assert ours.digest() == theirs.digest()
    assert ours.bytes_per_chunk == theirs.bytes_per_chunk


def test_the_figures_both_give(folders) -> None:
    """The hand-computed c of each config at TP 2, bf16, 256-token chunks."""
    c = {
        n: derive.derive_from_folder(folders[n], tp_size=2, chunk_tokens=256, dtype="bfloat16")
        for n in CONFIGS
    }
    assert c["gqa-llama"].bytes_per_chunk == 4 * 2 * 256 * 4 * 128 * 2  # 4 KV heads per rank
    assert c["deepseek-v2-lite"].bytes_per_chunk == 3 * 256 * 576 * 2  # the latent, replicated
    assert c["gemma2-sliding"].bytes_per_chunk == 4 * 2 * 256 * 2 * 256 * 2
    assert c["mistral-sliding"].bytes_per_chunk == 2 * 2 * 256 * 4 * 128 * 2
    kinds = [type(s).__name__ for s in layer_specs(folders["gemma2-sliding"], tp_size=2)]
    assert kinds == ["SlidingWindowSpec", "FullAttentionSpec"] * 2  # Gemma-2's layer_types
    assert (
        derive.layer_kinds(json.loads((DATA / "gemma2-sliding.json").read_text()), 4)
        == [
            "sliding",
            "full",
        ]
        * 2
    )
    mistral = [type(s).__name__ for s in layer_specs(folders["mistral-sliding"], tp_size=1)]
    assert mistral == ["SlidingWindowSpec"] * 2
    mla = layer_specs(folders["deepseek-v2-lite"], tp_size=2)
    assert [(s.num_kv_heads, s.head_size, s.head_size_v) for s in mla] == [(1, 576, 0)] * 3
