"""The tiny models' recipes: their geometry, pure (no torch, no transformers), and the tiny
Llama's registration (``tiny_llama_cpu``).

``bsrctl.stack.launch.tinymodel`` builds a model folder from a recipe; ``registration: auto`` and
``tiny_llama_cpu`` read the same recipe, so the geometry has one home.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from bsrkv.registration import GroupSpec, Registration, TensorSpec

RECIPE_VERSION = 1


@dataclass(frozen=True)
class TinyModelRecipe:
    # Head dim 32 is the smallest the CPU attention kernels accept (CPU stack facts).
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 131072  # ≥ the longest prompt any CPU spec sends
    vocab_size: int = 1024  # BPE target; the trained vocab may be smaller
    seed: int = 0
    recipe_version: int = RECIPE_VERSION
    family: str = "llama"  # llama | qwen3 (q/k norms, explicit head_dim)
    explicit_head_dim: int = 0  # 0: hidden_size / heads (Llama); qwen3 sets its own

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_attention_heads

    @property
    def name(self) -> str:
        return f"tiny-{self.family}"

    def digest(self) -> str:
        doc = asdict(self)
        if self.family == "llama" and not self.explicit_head_dim:
            # recipes from before these fields hash (and name their folder) as they did
            del doc["family"], doc["explicit_head_dim"]
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def hf_config(self) -> dict[str, object]:
        """The config.json fields the model is built from (what `registration: auto` reads)."""
        arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.family]
        doc: dict[str, object] = {
            "architectures": [arch],
            "model_type": self.family,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "torch_dtype": "float32",
        }
        if self.explicit_head_dim:
            doc["head_dim"] = self.explicit_head_dim
        return doc

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """K and V, every layer, float32 on CPU."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes


# A second architecture for `registration: auto` end to end: Qwen3 (q/k norms), 3 layers,
# 2 query heads of head dim 64 (not hidden / heads), 1 KV head: 2 x 3 x 1 x 64 x 4 B =
# 1,536 B per token, c = 393,216 B per 256-token chunk (the tiny Llama: 1,024 and 262,144).
TINY_QWEN3 = TinyModelRecipe(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    family="qwen3",
    explicit_head_dim=64,
)


TINY_LLAMA_BYTES_PER_CHUNK = 262_144  # measured on the CPU serving stack


def tiny_llama_cpu(chunk_tokens: int = 256, tp_size: int = 1) -> Registration:
    """The tiny CPU Llama of the serving stack (``TinyModelRecipe``'s geometry: 2 layers,
    2 KV heads, head dim 32), float32.

    vLLM registers one KV tensor per layer, (K/V, tokens, kv heads, head dim); LMCache
    stores a chunk as one object (KV_2LTD: (2, layers, tokens, heads*dim)) of the same
    bytes: 2 * 2 * 256 * 2 * 32 * 4 = 262,144 B per 256-token chunk, as measured.
    With TP = 2 each rank holds one KV head.
    """
    r = TinyModelRecipe()
    heads = r.num_key_value_heads // tp_size
    shape = (2, chunk_tokens, heads, r.head_dim)
    tensors = tuple(
        TensorSpec(f"model.layers.{i}.self_attn.attn", shape, "float32", 0)
        for i in range(r.num_hidden_layers)
    )
    return Registration(
        "tiny-llama-cpu", tensors, (GroupSpec(0, "attention"),), tp_size, chunk_tokens
    )
