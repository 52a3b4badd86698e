from pathlib import Path

import pytest

from bsrctl.errors import BadInput
from bsrctl.stack.launch import tinymodel


def test_rebuild_is_byte_identical_and_content_addressed(tmp_path: Path) -> None:
    a = tinymodel.build(cache_dir=tmp_path / "a")
    b = tinymodel.build(cache_dir=tmp_path / "b")
    assert a.name == b.name == f"tiny-llama-{tinymodel.TinyModelRecipe().digest()[:16]}"
    assert tinymodel.file_digests(a) == tinymodel.file_digests(b)
    assert tinymodel.model_sha256(a) == tinymodel.model_sha256(b)
    assert tinymodel.build(cache_dir=tmp_path / "a") == a  # cached: no rebuild
    names = sorted(p.name for p in a.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "model.sha256.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_geometry_matches_stack_notes() -> None:
    r = tinymodel.TinyModelRecipe()
    assert (r.head_dim, r.num_key_value_heads, r.num_hidden_layers) == (32, 2, 2)
    # K and V x 2 layers x 2 KV heads x 32 dims x float32: 1024 B/token, 262,144 B per chunk.
    assert r.kv_bytes_per_token() * 256 == 262_144


def test_vocab_size_of_any_model_folder(tmp_path: Path) -> None:
    # A user's model folder has config.json and no model.sha256.json (the failure matrix and
    # the round trip read the vocab of whatever stack.vllm.model names).
    plain = tmp_path / "llama"
    plain.mkdir()
    (plain / "config.json").write_text('{"vocab_size": 128256, "hidden_size": 4096}')
    assert not tinymodel.has_manifest(plain)
    assert tinymodel.vocab_size(plain) == 128256
    multimodal = tmp_path / "vl"
    multimodal.mkdir()
    (multimodal / "config.json").write_text('{"text_config": {"vocab_size": 151936}}')
    assert tinymodel.vocab_size(multimodal) == 151936


def test_vocab_size_of_the_tiny_model_is_its_trained_vocab(tmp_path: Path) -> None:
    # The manifest wins over config.json (the same number for the tiny model).
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text('{"vocab_size": 1024}')
    (folder / tinymodel.MANIFEST).write_text('{"vocab_size": 1000, "files": {}}')
    assert tinymodel.has_manifest(folder)
    assert tinymodel.vocab_size(folder) == 1000


def test_a_folder_without_a_vocab_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"stack.vllm.model: cannot read .*config.json"):
        tinymodel.vocab_size(tmp_path)
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    with pytest.raises(BadInput, match=r"config.json names no vocab_size"):
        tinymodel.vocab_size(tmp_path)
