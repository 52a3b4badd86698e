from pathlib import Path

from bsrctl.stack import tinymodel


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
