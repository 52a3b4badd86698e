"""A serving run's deployment has one description: `serving.stack` (a StackSpec), whose
unset fields come from the run's shorthands (max_num_seqs, engine_cpus, l1_mib) and the
serving defaults (max_model_len 8192). Every shipped TempoKV spec gives exactly the stack,
adapter settings and KV geometry it gave before; the chunk size, the retrieval rate and
the KV bytes per token reach the adapter and tempokv.configure from the spec alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from bsrctl.experiments.tempokv import calls
from bsrctl.experiments.tempokv.serving import MIB, engine_cpus_default, stack_for
from bsrctl.registration.tiny import TinyModelRecipe
from bsrctl.specs import LmcacheSpec, StackSpec, VllmSpec
from bsrctl.tempokv import wire
from bsrctl.tempokv.live import AdapterSettings
from bsrctl.tempokv.spec import ServingRun, TempoKVSpec, load

LADDERS = sorted((Path(__file__).resolve().parents[2] / "ladders").glob("tempokv-*.yaml"))


def _before(spec: TempoKVSpec) -> tuple[StackSpec, AdapterSettings]:
    """What stack_for built before the run embedded its StackSpec (main at fa75bee)."""
    run = spec.serving
    stack = StackSpec(
        vllm=VllmSpec(
            max_num_seqs=run.max_num_seqs,
            max_model_len=8192,
            cpu_threads_bind=run.engine_cpus or engine_cpus_default(os.cpu_count() or 1),
        ),
        lmcache=LmcacheSpec(l1_size_bytes=run.l1_mib * MIB, chunk_size=256),
    )
    adapter = AdapterSettings.from_json({
        "k": run.claims_k, "needs_ttu": True, "ttu_tolerance_s": spec.control.tick_s,
        "output_limit_tokens": run.max_tokens, "chunk_tokens": 256,
        "kv_bytes_per_token": TinyModelRecipe().kv_bytes_per_token(),
        "retrieval_bytes_s": 1e9,
        "cost": {"step_base_s": run.step_base_s, "token_s": run.token_s,
                 "attn_pair_s": 0.0, "decode_ctx_token_s": 0.0},
    })  # fmt: skip
    return stack, adapter


@pytest.mark.parametrize("path", LADDERS, ids=lambda p: p.name)
def test_every_shipped_spec_deploys_what_it_did(path: Path, tmp_path: Path) -> None:
    spec, _raw = load(path)
    stack, info = stack_for(spec, tmp_path)
    want_stack, want_adapter = _before(spec)
    assert stack.spec == want_stack
    assert stack.extensions is not None and stack.extensions.tempokv is not None
    assert stack.extensions.tempokv.adapter == want_adapter
    assert info["adapter"] == wire.settings_to_json(want_adapter)
    assert info["kv_bytes_per_token"] == 1024 == TinyModelRecipe().kv_bytes_per_token()
    cfg = calls.tempo_config(spec, "tempokv")
    assert cfg == wire.TempoConfig("tempokv", spec.serving.l1_mib * MIB,
                                   int(spec.serving.budget_mib * MIB), 1,
                                   spec.serving.l2_bandwidth_mib_s * MIB,
                                   spec.serving.l2_latency_s, None,
                                   spec.control.tick_s, 256)  # fmt: skip


def test_the_stack_sets_the_chunk_rate_and_geometry_everywhere(tmp_path: Path) -> None:
    spec = TempoKVSpec.model_validate({
        "models": [{"name": "llama-3.1-8b"}],
        "serving": {"retrieval_bytes_s": 2e9, "engine_cpus": "0",
                    "stack": {"vllm": {"max_model_len": 4096, "kv_cache_dtype": "fp8"},
                              "lmcache": {"chunk_size": 128}}},
        "experiment": {"kind": "policies", "cache_ratios": [1.0]},
    })  # fmt: skip
    stack, info = stack_for(spec, tmp_path)
    v, lm = stack.spec.vllm, stack.spec.lmcache
    assert (v.max_model_len, v.max_num_seqs, v.cpu_threads_bind) == (4096, 2, "0")
    assert (lm.chunk_size, lm.l1_size_bytes) == (128, 256 * MIB)
    adapter = stack.extensions.tempokv.adapter
    # fp8 KV: 1 B per element, from the deployment's registration (not the recipe's float32)
    assert (adapter.chunk_tokens, adapter.retrieval_bytes_s, adapter.kv_bytes_per_token) == (
        128, 2e9, 256)  # fmt: skip
    assert info["kv_bytes_per_token"] == 256
    assert calls.tempo_config(spec, "demand").chunk_tokens == 128


def test_a_shorthand_and_its_stack_field_agree_or_fail_naming_both() -> None:
    run = ServingRun.model_validate(
        {"stack": {"vllm": {"max_num_seqs": 3}, "lmcache": {"l1_size_bytes": 64 * MIB}}}
    )
    assert (run.max_num_seqs, run.l1_mib) == (3, 64)  # the shorthands read the stack's
    assert (run.stack.vllm.max_num_seqs, run.stack.lmcache.l1_size_bytes) == (3, 64 * MIB)
    same = ServingRun.model_validate({"max_num_seqs": 3, "stack": {"vllm": {"max_num_seqs": 3}}})
    assert same.stack.vllm.max_num_seqs == 3
    with pytest.raises(ValidationError) as err:
        ServingRun.model_validate({"l1_mib": 32, "stack": {"lmcache": {"l1_size_bytes": 1024}}})
    assert ("l1_mib 32 and stack.lmcache.l1_size_bytes 1024 both set the deployment's "
            "l1_size_bytes; set one") in str(err.value)  # fmt: skip
    with pytest.raises(ValidationError) as err:
        ServingRun.model_validate({"stack": {"vllm": {"max_num_seq": 3}}})
    assert "max_num_seq" in str(err.value)  # StackSpec's own strictness: no unknown field
    with pytest.raises(ValidationError) as err:  # a bad shorthand is named, not a crash
        ServingRun.model_validate({"l1_mib": "big"})
    assert "l1_mib\n  Input should be a valid integer" in str(err.value)
    assert ServingRun().stack == ServingRun.model_validate({}).stack
    assert ServingRun().stack.vllm.max_model_len == 8192
