"""The tiny Llama the CPU stack serves: built locally and deterministically, never downloaded.

Weights come from torch.manual_seed(0) over a fixed LlamaConfig; the tokenizer is a byte-level
BPE trained on text generated from a fixed seed. The folder is content-addressed by the recipe
(a rebuild is byte-identical), and the sha256 of every file is recorded in model.sha256.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from bsrctl.errors import BadInput

# The recipes are pure geometry (bsrctl.registration.tiny); this module builds from them.
from bsrctl.registration.tiny import RECIPE_VERSION, TINY_QWEN3, TinyModelRecipe  # noqa: F401

MANIFEST = "model.sha256.json"
WORDS = (
    "cache prefix restore window chunk tier store layer token block rank group probe plan "
    "stage commit fail close bound pool byte time ready use claim budget fast slow disk "
    "remote local engine server model query key value head"
).split()


def default_cache_dir() -> Path:
    return Path(os.environ.get("BSRCTL_CACHE", Path.cwd() / ".cache")) / "models"


def _corpus(seed: int, lines: int = 2000) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24))) for _ in range(lines)]


def _build_tokenizer(recipe: TinyModelRecipe, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(recipe.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(out)


def _build_weights(recipe: TinyModelRecipe, vocab_size: int, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    }[recipe.family]
    extra = {"head_dim": recipe.explicit_head_dim} if recipe.explicit_head_dim else {}
    cfg = config_cls(
        **extra,
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
    )
    torch.manual_seed(recipe.seed)
    model = model_cls(cfg)
    model.save_pretrained(out, safe_serialization=True)


def file_digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }


def folder(recipe: TinyModelRecipe | None = None, cache_dir: Path | None = None) -> Path:
    """Where ``build`` puts (or finds) the model, content-addressed by its recipe; builds
    nothing (``stack plan`` names it)."""
    recipe = recipe or TinyModelRecipe()
    return (cache_dir or default_cache_dir()) / f"{recipe.name}-{recipe.digest()[:16]}"


def build(recipe: TinyModelRecipe | None = None, cache_dir: Path | None = None) -> Path:
    """Return the model folder, building it once. Safe against concurrent builders."""
    recipe = recipe or TinyModelRecipe()
    root = cache_dir or default_cache_dir()
    final = folder(recipe, root)
    if (final / MANIFEST).exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
    try:
        _build_tokenizer(recipe, tmp)
        vocab = len(json.loads((tmp / "tokenizer.json").read_text())["model"]["vocab"])
        _build_weights(recipe, vocab, tmp)
        digests = file_digests(tmp)
        manifest = {"recipe": asdict(recipe), "vocab_size": vocab, "files": digests}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        try:
            tmp.rename(final)
        except OSError:  # another builder won the race; its output is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def has_manifest(folder: Path) -> bool:
    """Whether ``folder`` is a model this module built (it carries model.sha256.json)."""
    return (folder / MANIFEST).is_file()


def model_sha256(folder: Path) -> str:
    """One digest for the whole model: sha256 over the manifest of file digests."""
    files = json.loads((folder / MANIFEST).read_text())["files"]
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def vocab_size(folder: Path) -> int:
    """The vocab prompts draw token ids from, for any model folder: the tiny model's trained
    vocab (its manifest), else config.json's ``vocab_size`` (top level, or the text model's
    of a multimodal config). A user's model folder has no manifest."""
    if has_manifest(folder):
        return int(json.loads((folder / MANIFEST).read_text())["vocab_size"])
    config = folder / "config.json"
    try:
        doc = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"stack.vllm.model: cannot read {config} ({exc})") from None
    size = doc.get("vocab_size") or (doc.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise BadInput(f"stack.vllm.model: {config} names no vocab_size")
    return size
