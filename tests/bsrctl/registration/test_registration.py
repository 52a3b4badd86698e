"""State geometry: c, W·c + aux and the digest, with hand-computed values."""

from __future__ import annotations

import dataclasses

import pytest

from bsrctl.registration.dsv4 import PAPER_BYTES_PER_CHUNK, PAPER_NUM_TENSORS, dsv4_flash_mtp_off
from bsrctl.registration.tiny import TINY_LLAMA_BYTES_PER_CHUNK, tiny_llama_cpu
from bsrkv.registration import GroupSpec, Registration, TensorSpec


def test_the_papers_geometry_sums_to_its_c() -> None:
    reg = dsv4_flash_mtp_off(tp_size=2)
    assert (reg.num_tensors, reg.bytes_per_chunk) == (PAPER_NUM_TENSORS, PAPER_BYTES_PER_CHUNK)
    assert (PAPER_NUM_TENSORS, PAPER_BYTES_PER_CHUNK) == (167, 16_408_576)
    assert reg.bytes_per_chunk_all_ranks == 2 * 16_408_576
    assert reg.window_bytes(32) == 525_074_432  # 500.75 MiB per rank, the paper's W = 32
    assert reg.window_bytes(1024) == 16_802_381_824  # its measured 256K whole-plan L1 peak
    # per group: 43 x (512 + 64) x 2 B, 40 x (128 + 4) B, 4640 x 2 B, all x 256 tokens
    assert [reg.group_bytes_per_chunk(g) for g in (0, 1, 2)] == [
        43 * 576 * 2 * 256,
        40 * 132 * 256,
        4640 * 2 * 256,
    ]


def test_the_tiny_llama_is_what_the_cpu_stack_measures() -> None:
    one, two = tiny_llama_cpu(), tiny_llama_cpu(tp_size=2)
    # 2 (K, V) x 2 layers x 256 tokens x 2 KV heads x 32 x 4 B
    assert one.bytes_per_chunk == TINY_LLAMA_BYTES_PER_CHUNK == 2 * 2 * 256 * 2 * 32 * 4
    assert two.bytes_per_chunk == TINY_LLAMA_BYTES_PER_CHUNK // 2  # one KV head per rank
    assert two.bytes_per_chunk_all_ranks == TINY_LLAMA_BYTES_PER_CHUNK
    assert tiny_llama_cpu(chunk_tokens=128).bytes_per_chunk == 131_072
    assert (one.num_chunks(4096), one.num_chunks(4000), one.num_chunks(255)) == (16, 15, 0)


def test_the_restore_pool_bound_is_w_times_c_plus_aux() -> None:
    reg = dataclasses.replace(tiny_llama_cpu(), aux_bytes=4096)
    assert reg.window_bytes(4) == 4 * 262_144
    assert reg.rws_bound_bytes(4) == 4 * 262_144 + 4096


def test_the_digest_names_the_tensors_not_the_object() -> None:
    a, b = tiny_llama_cpu(), tiny_llama_cpu()
    assert a.digest() == b.digest() and len(a.digest()) == 64
    assert tiny_llama_cpu(tp_size=2).digest() != a.digest()  # another per-rank shape
    renamed = dataclasses.replace(
        a, tensors=(dataclasses.replace(a.tensors[0], dtype="bfloat16"), *a.tensors[1:])
    )
    assert renamed.digest() != a.digest()
    assert a.to_dict()["digest"] == a.digest()


def test_a_tensor_naming_an_unknown_group_is_refused() -> None:
    t = TensorSpec("x", (256, 8), "float32", 3)
    with pytest.raises(ValueError):
        Registration("m", (t,), (GroupSpec(0, "attention"),), 1, 256)


def test_a_groups_sliding_window_is_not_bsrs_window() -> None:
    groups = tiny_llama_cpu().to_dict()["groups"]
    assert groups == [{"index": 0, "name": "attention", "sliding_window_chunks": -1}]


def test_tiny_llama_cpu_is_the_recipes_geometry() -> None:
    from bsrctl.registration.tiny import TinyModelRecipe

    r = TinyModelRecipe()
    for tp in (1, 2):
        reg = tiny_llama_cpu(chunk_tokens=128, tp_size=tp)
        assert len(reg.tensors) == r.num_hidden_layers == 2
        heads = r.num_key_value_heads // tp
        assert {t.shape for t in reg.tensors} == {(2, 128, heads, r.head_dim)}
        assert reg.bytes_per_chunk == 2 * r.num_hidden_layers * 128 * heads * r.head_dim * 4
    assert r.head_dim == 32 and r.kv_bytes_per_token() == 1024


def test_the_spec_models_import_nothing_of_the_stack() -> None:
    # the recipe lives below specs.py: parsing a spec loads no stack module (nor torch)
    import subprocess
    import sys

    code = (
        "import sys, bsrctl.specs; "
        "print(sorted(m for m in sys.modules if m.startswith(('bsrctl.stack', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
