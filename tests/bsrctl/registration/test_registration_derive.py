"""`registration: auto` and declared registrations, with hand-computed values at 256-token
chunks (per rank)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from bsrctl.errors import BadInput
from bsrctl.registration import declared
from bsrctl.registration.derive import derive, derive_from_folder
from bsrctl.registration.dsv4 import dsv4_flash_mtp_off
from bsrctl.registration.tiny import tiny_llama_cpu
from bsrctl.specs import TargetSpec
from bsrctl.stack.launch.tinymodel import TINY_QWEN3, TinyModelRecipe
from bsrkv.registration import first_difference

LADDERS = Path(__file__).parents[3] / "ladders"

# The fields of the published config.json files that the derivation reads.
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_window_layers": 28,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "torch_dtype": "bfloat16",
}
GEMMA2_9B = {  # every other layer (even ones) a 4096-token sliding window; a float32 checkpoint
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 3584,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "sliding_window": 4096,
    "torch_dtype": "float32",
}


def test_llama_31_8b_is_131072_bytes_per_token() -> None:
    # 32 layers x 2 (K, V) x 8 KV heads x 128 x 2 B = 131,072 B per token
    one, two = derive(LLAMA_31_8B), derive(LLAMA_31_8B, tp_size=2)
    assert one.bytes_per_chunk // 256 == 131_072
    assert (one.bytes_per_chunk, two.bytes_per_chunk) == (33_554_432, 16_777_216)
    assert two.bytes_per_chunk_all_ranks == 33_554_432
    assert one.num_tensors == 32 and one.tensors[0].shape == (2, 256, 8, 128)
    assert two.tensors[31].shape == (2, 256, 4, 128)  # 4 KV heads per rank
    assert one.tensors[5].name == "model.layers.5.self_attn.attn"
    assert (one.tensors[0].dtype, one.groups[0].sliding_window_chunks) == ("bfloat16", -1)


def test_qwen25_7b_is_57344_bytes_per_token_and_kv_heads_replicate_past_the_ranks() -> None:
    # 28 x 2 x 4 x 128 x 2 B; use_sliding_window false: one full-attention group
    reg = derive(QWEN25_7B)
    assert reg.bytes_per_chunk == 57_344 * 256 == 14_680_064
    assert [g.name for g in reg.groups] == ["attention"]
    # Llama-3.1-8B at TP 16 > 8 KV heads: each rank holds one (replicated), 32 x 2 x 1 x 128 x 2
    assert derive(LLAMA_31_8B, tp_size=16).bytes_per_chunk == 16_384 * 256 == 4_194_304
    # TP 7 divides Qwen's 28 query heads but neither divides nor is a multiple of 4 KV heads
    with pytest.raises(BadInput, match="stack.vllm.tensor_parallel_size: 7 does not divide"):
        derive(QWEN25_7B, tp_size=7)


def test_mla_is_one_latent_per_layer_on_every_rank() -> None:
    # 61 layers x (512 + 64) x 2 B = 70,272 B per token, not split by TP
    reg = derive(DEEPSEEK_V3)
    assert reg.bytes_per_chunk == 70_272 * 256 == 17_989_632
    assert reg.tensors[60].shape == (256, 576) and reg.num_tensors == 61
    assert derive(DEEPSEEK_V3, tp_size=8).bytes_per_chunk == 17_989_632


def test_sliding_window_layers_are_their_own_group() -> None:
    # LMCache's default: every layer of a chunk in one object group (full attention)
    one = derive(GEMMA2_9B)
    assert [(g.index, g.name, g.sliding_window_chunks) for g in one.groups] == [
        (0, "attention", -1)
    ]
    assert one.bytes_per_chunk == 344_064 * 256 == 88_080_384  # 42 x 2 x 8 x 256 x 2 B
    # vLLM's `auto` serves a float32 checkpoint in bfloat16 on a GPU
    assert {t.dtype for t in one.tensors} == {"bfloat16"}
    # --separate-object-groups: the sliding layers (Gemma-2's even ones, layer 0 first) are a
    # group of their own spanning 4096 / 256 chunks; groups in the order of their first layer
    reg = derive(GEMMA2_9B, separate_object_groups=True)
    assert [(g.index, g.name, g.sliding_window_chunks) for g in reg.groups] == [
        (0, "sliding_window", 16),
        (1, "attention", -1),
    ]
    assert [t.group for t in reg.tensors[:4]] == [0, 1, 0, 1]
    per_group = 21 * 2 * 8 * 256 * 2 * 256  # 21 layers each, 2 x 8 KV heads x 256 x 2 B
    assert [reg.group_bytes_per_chunk(g) for g in (0, 1)] == [per_group, per_group]
    assert reg.bytes_per_chunk == one.bytes_per_chunk
    # config's layer_types (Gemma-3, gpt-oss style) win over any rule; a 1000-token window
    # spans 4 chunks (ceil, as LMCache counts it)
    types = {"layer_types": ["full_attention"] + ["sliding_attention"] * 5}
    six = derive(
        GEMMA2_9B | {"num_hidden_layers": 6, "sliding_window": 1000} | types,
        separate_object_groups=True,
    )
    assert [t.group for t in six.tensors] == [0, 1, 1, 1, 1, 1]
    assert [(g.name, g.sliding_window_chunks) for g in six.groups] == [
        ("attention", -1),
        ("sliding_window", 4),
    ]
    # Mistral-7B-v0.1: every layer slides, one group
    mistral = LLAMA_31_8B | {"architectures": ["MistralForCausalLM"], "sliding_window": 4096}
    assert [
        (g.index, g.name, g.sliding_window_chunks)
        for g in derive(mistral, separate_object_groups=True).groups
    ] == [(0, "sliding_window", 16)]
    # Qwen2.5's sliding_window with use_sliding_window false (HF's default for Qwen) is no
    # sliding window at all
    for qwen in (QWEN25_7B, {k: v for k, v in QWEN25_7B.items() if k != "use_sliding_window"}):
        groups = derive(qwen, separate_object_groups=True).groups
        assert [(g.name, g.sliding_window_chunks) for g in groups] == [("attention", -1)]


def test_an_fp8_kv_cache_is_one_byte_per_element_as_vllm_allocates_it() -> None:
    # vLLM allocates fp8 caches as uint8: Llama-3.1-8B 65,536 B per token
    for kind in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        reg = derive(LLAMA_31_8B, kv_cache_dtype=kind)
        assert (reg.tensors[0].dtype, reg.bytes_per_chunk) == ("uint8", 16_777_216)
    assert derive(DEEPSEEK_V3, kv_cache_dtype="fp8").bytes_per_chunk == 35_136 * 256
    with pytest.raises(BadInput, match="stack.vllm.kv_cache_dtype: 'int3'"):
        derive(LLAMA_31_8B, kv_cache_dtype="int3")


def test_the_tiny_models_derive_to_what_the_cpu_stack_measures() -> None:
    tiny = TinyModelRecipe().hf_config()
    for tp in (1, 2):
        reg = derive(tiny, tp_size=tp, dtype="float32", name="tiny-llama-cpu")
        assert reg.digest() == tiny_llama_cpu(tp_size=tp).digest()
    assert derive(tiny, dtype="float32").bytes_per_chunk == 262_144
    # Qwen3: 3 layers x 2 x 1 KV head x head_dim 64 (not 128 / 2) x 4 B
    qwen = derive(TINY_QWEN3.hf_config(), dtype="float32")
    assert qwen.bytes_per_chunk == 1_536 * 256 == 393_216
    assert qwen.tensors[0].shape == (2, 256, 1, 64)


def test_an_unknown_architecture_is_bad_input_pointing_at_the_custom_form(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["MambaForCausalLM"]}')
    with pytest.raises(BadInput) as e:
        derive_from_folder(tmp_path, tp_size=1, chunk_tokens=256)
    assert "MambaForCausalLM" in str(e.value) and "registration.yaml" in str(e.value)
    with pytest.raises(BadInput, match="cannot read"):
        derive_from_folder(tmp_path / "none", tp_size=1, chunk_tokens=256)


@given(
    layers=st.integers(1, 96),
    kv_heads=st.sampled_from([1, 2, 4, 8, 16]),
    group=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.sampled_from([32, 64, 80, 128, 256]),
    tp=st.sampled_from([1, 2, 4, 8, 16]),
    chunk=st.sampled_from([16, 64, 256, 512]),
    dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
)
def test_gqa_geometry_invariants(layers, kv_heads, group, head_dim, tp, chunk, dtype) -> None:
    heads = kv_heads * group
    if heads % tp:
        return
    cfg = LLAMA_31_8B | {
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
    }
    reg = derive(cfg, tp_size=tp, chunk_tokens=chunk, dtype=dtype)
    elem = 4 if dtype == "float32" else 2
    per_rank = max(1, kv_heads // tp)
    assert reg.bytes_per_chunk == layers * 2 * per_rank * head_dim * elem * chunk
    if kv_heads >= tp:  # split: the ranks together hold every KV head once
        assert (
            reg.bytes_per_chunk_all_ranks
            == derive(cfg, chunk_tokens=chunk, dtype=dtype).bytes_per_chunk
        )


def test_the_papers_registrations_as_yaml() -> None:
    off = declared.load(LADDERS / "registrations" / "dsv4-flash-mtp-off.yaml")
    assert off.digest() == dsv4_flash_mtp_off().digest()  # the same tensors, in order
    assert (off.num_tensors, off.bytes_per_chunk) == (167, 16_408_576)
    on = declared.load(LADDERS / "registrations" / "dsv4-flash-mtp-on.yaml")
    assert on.num_tensors == 170  # the paper's count; its c is the illustrative shapes' sum
    assert on.bytes_per_chunk == 16_408_576 + 256 * (512 * 2 + 64 * 2 + 4640 * 2) == 19_079_168


def test_a_spec_declares_a_registration_inline_or_by_file(tmp_path: Path) -> None:
    doc = {
        "model": "custom",
        "chunk_tokens": 256,
        "tp_size": 1,
        "aux_bytes": 4096,
        "groups": [{"index": 0, "name": "attention"}],
        "tensors": [
            {
                "layers": [0, 2],
                "tensors": [{"name": "l{i}", "shape": [2, "T", 2, 32], "dtype": "float32"}],
            }
        ],
    }
    spec = TargetSpec(registration=doc)
    reg = spec.registration_for("serving")
    assert (reg.bytes_per_chunk, reg.aux_bytes, reg.tensors[1].name) == (262_144, 4096, "l1")
    assert TargetSpec(registration=doc, aux_bytes=0).registration_for("serving").aux_bytes == 0
    assert TargetSpec().registration == "auto"
    assert TargetSpec().registration_for("storage").digest() == tiny_llama_cpu().digest()
    with pytest.raises(BadInput, match="declared for chunk_tokens 256 and tp_size 1"):
        TargetSpec(registration=doc, storage={"tp_ranks": 2}).registration_for("storage")
    bad = doc | {"tensors": [{"name": "x", "shape": ["T"], "dtype": "float64"}]}
    with pytest.raises(BadInput, match="registration.tensors: x has dtype 'float64'"):
        TargetSpec(registration=bad).registration_for("serving")
    with pytest.raises(BadInput, match=r"registration\.tensors"):
        TargetSpec(registration=doc | {"tensors": [{"name": "x"}]}).registration_for("serving")
    with pytest.raises(BadInput, match="does not exist"):
        TargetSpec(registration=str(tmp_path / "none.yaml")).registration_for("serving")


def test_first_difference_names_the_first_tensor() -> None:
    a = tiny_llama_cpu().geometry()
    live = tuple(f"kv[{i}]={g.split('=', 1)[1]}" for i, g in enumerate(a))
    assert first_difference(a, live, "live") is None
    wrong = (live[0], live[1].replace("float32", "bfloat16"))
    assert first_difference(a, wrong, "live") == (
        "tensor 1 (model.layers.1.self_attn.attn): live [2, 256, 2, 32] bfloat16 g0 != "
        "expected [2, 256, 2, 32] float32 g0"
    )
    assert first_difference(a, live[:1], "stored") == "stored has 1 tensors, expected 2"


def test_the_gpu_spec_derives_llama_31_8b(tmp_path: Path) -> None:
    """ladders/gpu-1x.yaml with a folder holding Llama-3.1-8B's config.json: c = 32 MiB, the
    W = 32 pool 1 GiB, the largest whole plan within its 24 GiB L1 and 16 GiB rung."""
    from bsrctl.experiments.restore.spec import load_experiment

    folder = tmp_path / "Llama-3.1-8B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_31_8B))
    doc = yaml.safe_load((LADDERS / "gpu-1x.yaml").read_text())
    assert (doc["registration"], doc["stack"]["vllm"]["model"]) == (
        "auto",
        "/models/Llama-3.1-8B-Instruct",
    )
    doc["stack"]["vllm"]["model"] = str(folder)
    path = tmp_path / "gpu-1x.yaml"
    path.write_text(yaml.safe_dump(doc))
    spec, _ = load_experiment(path, "sweep", "serving")
    reg = spec.registration_for("serving")
    assert (reg.bytes_per_chunk, reg.window_bytes(32)) == (33_554_432, 1 << 30)
    largest = reg.window_bytes(reg.num_chunks(max(doc["sweep"]["sizes_tokens"])))
    assert largest == 17_045_651_456 < doc["stack"]["lmcache"]["l1_size_bytes"]
    assert largest < (16 << 30) < (32 << 30)  # the ladder's 16 GiB rung holds it


def test_bsrctl_sweep_on_an_unknown_architecture_exits_2_before_starting(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from bsrctl.cli import app

    folder = tmp_path / "rwkv"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["RwkvForCausalLM"]}')
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"stack: {{vllm: {{model: {folder}}}}}\nsweep: {{sizes_tokens: [1024]}}\n")
    res = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "out")])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {spec}: registration: auto does not know")
    assert "RwkvForCausalLM" in lines[0] and "registration.yaml" in lines[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@given(
    tensors=st.lists(
        st.tuples(
            st.lists(st.integers(1, 64), min_size=0, max_size=3),
            st.sampled_from(["float32", "bfloat16", "uint8", "float8_e4m3fn"]),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=12,
    ),
    chunk=st.sampled_from([16, 256]),
    tp=st.integers(1, 8),
)
def test_a_declared_registration_is_the_one_written(tensors, chunk, tp) -> None:
    """Any registration written as YAML reads back with the same tensors, c and digest."""
    from bsrkv.registration import DTYPE_BYTES, GroupSpec, Registration, TensorSpec

    specs = tuple(
        TensorSpec(f"t{i}", (chunk, *dims), dtype, group)
        for i, (dims, dtype, group) in enumerate(tensors)
    )
    groups = tuple(GroupSpec(g, f"g{g}") for g in range(3))
    want = Registration("m", specs, groups, tp, chunk)
    doc = {
        "model": "m",
        "chunk_tokens": chunk,
        "tp_size": tp,
        "groups": [{"index": g.index, "name": g.name} for g in groups],
        "tensors": [
            {"name": t.name, "shape": ["T", *t.shape[1:]], "dtype": t.dtype, "group": t.group}
            for t in specs
        ],
    }
    got = declared.parse(yaml.safe_load(yaml.safe_dump(doc)), "registration")
    assert got.digest() == want.digest()
    assert got.bytes_per_chunk == sum(
        DTYPE_BYTES[d] * chunk * math.prod(dims) for dims, d, _ in tensors
    )


def test_deepseek_v4_under_auto_is_vllms_caches() -> None:
    """auto derives DSV4 (bsrctl.registration.dsv4; tests/bsrctl/registration/test_dsv4.py
    pins it)."""
    cfg = json.loads((LADDERS / "models" / "DeepSeek-V4-Flash" / "config.json").read_text())
    reg = derive(cfg, tp_size=2, name="DeepSeek-V4-Flash")
    assert (reg.num_tensors, reg.bytes_per_chunk, reg.engine_groups) == (167, 83_436_096, 5)
    with pytest.raises(BadInput, match="stack.vllm.kv_cache_dtype: 'bfloat16'"):
        derive(cfg, tp_size=2, kv_cache_dtype="bfloat16")
