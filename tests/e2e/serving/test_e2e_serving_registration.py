"""`registration: auto` end to end on a second architecture: a tiny Qwen3 (3 layers, 1 KV
head of head dim 64, q/k norms) built locally like the tiny Llama, `bsrctl sweep` at W = 2:
the derived c (393,216 B per chunk) equals the live one vLLM registered with LMCache and the
measured restore-pool peak is W·c at every size."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bsrctl.evidence import Verdict

from .e2e_support import SMOKE, assert_nothing_left, only_run, require_server_module

pytestmark = pytest.mark.e2e

C_QWEN3 = 2 * 3 * 1 * 64 * 4 * 256  # K/V x layers x KV heads x head dim x float32 x tokens


@pytest.fixture(scope="module")
def qwen_sweep(tmp_path_factory: pytest.TempPathFactory):
    require_server_module()
    from bsrctl.experiments.restore.sweep import run_sweep
    from bsrctl.stack.launch import tinymodel

    out = tmp_path_factory.mktemp("qwen-sweep")
    doc = yaml.safe_load(SMOKE.read_text())
    doc["stack"]["vllm"]["model"] = str(tinymodel.build(tinymodel.TINY_QWEN3))
    doc["registration"] = "auto"
    doc["salt"] = "bsrctl-qwen3-auto"
    doc["sweep"] = {"sizes_tokens": [1024, 2048], "window_chunks": 2, "repeats": 1}  # cost kept
    spec = out.parent / "qwen3-sweep.yaml"
    spec.write_text(yaml.safe_dump(doc))
    verdict = run_sweep(spec, out, "serving", quiet=True)
    return verdict, out, only_run(out)


def test_derived_c_is_live_c_is_the_measured_peak_over_w(qwen_sweep) -> None:
    verdict, _, doc = qwen_sweep
    failed = [(p["id"], c) for p in doc["points"] for c in p["checks"] if c["verdict"] != "PASS"]
    assert (verdict, doc["complete"]) == (Verdict.PASS, True), failed or doc["summary"]
    assert C_QWEN3 == 393_216
    reg = doc["stack"]["registration"]
    assert (reg["bytes_per_chunk"], reg["num_tensors"]) == (C_QWEN3, 3)
    (live,) = doc["stack"]["registration_live"]  # one engine instance (TP 1)
    assert [(t["shape"], t["dtype"], t["group"]) for t in live["tensors"]] == [
        ([2, 256, 1, 64], "float32", 0)
    ] * 3
    assert [g["sliding_window_chunks"] for g in live["groups"]] == [-1]
    # vLLM's CPU backend: (blocks, KV heads, 128-token block, K and V of 64 packed) per layer,
    # one engine group (EngineGroupInfo) of the three layers
    assert live["tensors"][0]["registered_shape"][1:] == [1, 128, 128]
    assert live["engine_groups"] == [
        {
            "engine_group_id": 0,
            "layer_indices": [0, 1, 2],
            "tokens_per_block": 128,
            "sw_size_tokens": -1,
            "engine_kv_format": "NL_X_NB_NH_BS_CS",
        }
    ]
    assert [p["id"] for p in doc["points"]] == ["n1024-w2", "n2048-w2"]
    for p in doc["points"]:
        m = p["measures"]
        checks = {c["name"]: c for c in p["checks"]}
        assert p["verdict"] == "PASS", p["checks"]
        assert m["restore_pool_peak_bytes"] == 2 * C_QWEN3
        assert m["bytes_per_chunk_measured"] == m["bytes_per_chunk_expected"] == C_QWEN3
        want = [f"model.layers.{i}.self_attn.attn=[2, 256, 1, 64] float32 g0" for i in range(3)]
        assert m["registration_tensors_expected"] == want
        assert m["registration_tensors_live"] == [w.replace("model.layers.", "kv[").replace(
            ".self_attn.attn", "]") for w in want]  # fmt: skip
        assert m["registration_tensors_stored"] == m["registration_tensors_live"]
        assert "3 tensors derived == live == stored" in checks["registration_identity"]["detail"]


def test_nothing_left_behind(qwen_sweep) -> None:
    _, out, _ = qwen_sweep
    assert_nothing_left(Path(out))
