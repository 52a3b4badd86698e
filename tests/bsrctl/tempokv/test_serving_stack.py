"""A serving run's deployment has one description: `serving.stack` (a StackSpec), whose
unset fields come from the run's shorthands (max_num_seqs, engine_cpus, l1_mib) and the
serving defaults (max_model_len 8192). Every shipped TempoKV spec gives exactly the stack,
adapter settings and KV geometry it gave before; the chunk size, the retrieval rate and
the KV bytes per token reach the adapter and tempokv.configure from the spec alone."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from bsrctl.registration.tiny import TinyModelRecipe
from bsrctl.specs import LmcacheSpec, StackSpec, VllmSpec
from bsrctl.stack.launch.extensions import (
    L1Options,
    L2Device,
    TempoKVLaunch,
    bsr_extensions,
    odirect_allowed,
)
from bsrctl.stack.launch.fast_tier import FastTierConfig
from bsrctl.stack.launch.process import Supervised
from bsrctl.stack.launch.serving import ServingStack
from bsrctl.tempokv.experiments import calls, serving
from bsrctl.tempokv.experiments.serving import MIB, deployment_for, engine_cpus_default
from bsrctl.tempokv.spec import ServingRun, TempoKVSpec, load
from bsrkv.settings import RestoreSettings, RestoreTuning
from bsrkv.tempokv import wire
from bsrkv.tempokv.live import AdapterSettings

ALL = sorted((Path(__file__).resolve().parents[3] / "ladders").glob("tempokv-*.yaml"))
FLASH = [p for p in ALL if load(p)[0].serving.fast_tier is not None]
LADDERS = [p for p in ALL if p not in FLASH]  # the specs from before the flash tier


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
    dep, info = deployment_for(spec, tmp_path)
    stack = dep.stack
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


@pytest.mark.parametrize("path", FLASH, ids=lambda p: p.name)
def test_a_flash_tier_spec_deploys_l1_on_the_arena_and_stages_by_mlock(
    path: Path, tmp_path: Path
) -> None:
    spec, _raw = load(path)
    ft = spec.serving.fast_tier
    assert ft is not None
    dep, info = deployment_for(spec, tmp_path)
    ext = dep.stack.extensions
    assert ext is not None and ext.l2_device is None
    assert ext.fast_tier == FastTierConfig(ft.arena_mib * MIB, int(ft.fast_tier_mib * MIB),
                                           int(ft.flash_mib_s * MIB), 1193)  # fmt: skip
    # the demand path: CMM-H's ~5 GB/s on NAND / 1024 = 4.66 MiB/s of 4 KiB reads
    assert (ft.demand_mib_s, round(ft.demand_ratio, 4)) == (4.66, 0.4236)
    lm = dep.stack.spec.lmcache
    assert (lm.fs_l2, lm.l1_size_bytes) == (False, ft.arena_mib * MIB)
    assert dep.stack.spec.vllm.num_gpu_blocks_override == 434  # the H100's KV, scaled
    assert info["fast_tier"] == vars(ext.fast_tier) and info["odirect"] is False
    assert calls.tempo_config(spec, "tempokv") == wire.TempoConfig(
        "tempokv", int(ft.fast_tier_mib * MIB), int(spec.serving.budget_mib * MIB), 1,
        int(ft.flash_mib_s * MIB), 0.0, None, spec.control.tick_s, 256, "dax",
    )  # fmt: skip
    assert spec.serving.budget_mib == ft.fast_tier_mib / 2  # §5.3: half the fast tier
    base, _ = deployment_for(spec, tmp_path / "b", with_adapter=False)
    assert base.stack.extensions is not None and base.stack.extensions.tempokv is None
    assert base.stack.extensions.fast_tier == ext.fast_tier  # LMCache-DAX: the same tier


def test_the_budget_must_fit_in_the_fast_tier() -> None:
    raw = {"models": [{"name": "llama-3.1-8b"}], "experiment": {"kind": "policies",
           "cache_ratios": [1.0]}, "serving": {"budget_mib": 101.0, "fast_tier": {
           "arena_mib": 128, "fast_tier_mib": 100.0, "flash_mib_s": 11.0}}}  # fmt: skip
    with pytest.raises(ValidationError, match="budget_mib 101.0 exceeds fast_tier.fast_tier_mib"):
        TempoKVSpec.model_validate(raw)


def test_the_stack_sets_the_chunk_rate_and_geometry_everywhere(tmp_path: Path) -> None:
    spec = TempoKVSpec.model_validate({
        "models": [{"name": "llama-3.1-8b"}],
        "serving": {"retrieval_bytes_s": 2e9, "engine_cpus": "0", "documents_tokens": [2048],
                    "stack": {"vllm": {"max_model_len": 4096, "kv_cache_dtype": "fp8"},
                              "lmcache": {"chunk_size": 128}}},
        "experiment": {"kind": "policies", "cache_ratios": [1.0]},
    })  # fmt: skip
    dep, info = deployment_for(spec, tmp_path)
    stack = dep.stack
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


def _stack_before(spec: TempoKVSpec, run_dir: Path, with_adapter: bool) -> ServingStack:
    """What stack_for built before TempoKV serving took a Deployment (main at 49823e7)."""
    run = spec.serving
    stack_spec = serving.stack_spec(run)
    adapter = serving.adapter_settings(spec, stack_spec)
    odirect = odirect_allowed(run_dir / "stack" / "l2-fs")
    ext = replace(
        bsr_extensions(RestoreSettings.of(RestoreTuning(), 0)),
        l2_device=L2Device(run.l2_bandwidth_mib_s * MIB, run.l2_latency_s, odirect),
        tempokv=TempoKVLaunch(adapter, trace_path=str(run_dir / "adapter-trace.jsonl"))
        if with_adapter
        else None,
    )
    return ServingStack(stack_spec, run_dir, ext)


def launches(stack: ServingStack, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple]:
    """The LMCache and vLLM command lines and environments ``stack`` would launch, in
    launch order (nothing is started: fixed ports and model folder)."""
    seen: dict[str, tuple] = {}
    monkeypatch.setattr(
        ServingStack, "_launch", lambda _s, part: seen.setdefault(part.name, (part.argv, part.env))
    )
    monkeypatch.setattr(Supervised, "wait_healthy", lambda *_a, **_k: None)  # fmt: skip
    stack.model_dir = Path("/models/tiny")
    stack.ports = {"lmcache.port": 6555, "lmcache.http_port": 6556, "vllm.port": 6557}
    assert stack.control_token  # each stack draws its own: the comparison fixes it
    stack.control_token = "<control-token>"
    stack.start_lmcache()
    stack.start_vllm()
    return seen


@pytest.mark.parametrize("with_adapter", [True, False], ids=["tempokv", "lmcache-baseline"])
@pytest.mark.parametrize("path", LADDERS, ids=lambda p: p.name)
def test_the_deployment_launches_the_argv_and_env_the_stack_did(
    path: Path, with_adapter: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, _raw = load(path)
    before = launches(_stack_before(spec, tmp_path, with_adapter), monkeypatch)
    dep, _info = deployment_for(spec, tmp_path, with_adapter=with_adapter)
    assert (dep.kind, type(dep).__name__, dep.settings) == (
        "serving", "LaunchedDeployment", RestoreSettings.of(RestoreTuning(), 0))  # fmt: skip
    after = launches(dep.stack, monkeypatch)
    assert list(after) == list(before) == ["lmcache", "vllm"]
    assert after == before  # the same command lines and environments, part by part
    (lm_argv, _lm_env), (v_argv, v_env) = after["lmcache"], after["vllm"]
    assert ("--l2-prefetch-policy" in lm_argv) is with_adapter
    assert ("--scheduler-cls" in v_argv) is with_adapter
    assert ("BSRKV_TEMPOKV" in v_env) is with_adapter
    # the adapter's tempokv.update calls are mutating: its vLLM holds the stack's token
    assert (v_env.get("BSRKV_CONTROL_TOKEN") == "<control-token>") is with_adapter
    assert _lm_env["BSRKV_CONTROL_TOKEN"] == "<control-token>"
    assert dep.stack.dir == tmp_path / "stack" and dep.stack.spec == serving.stack_spec(
        spec.serving
    )


def test_the_stock_arm_with_tempokvs_l1_options_changes_only_lmcaches_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Figure 6's decomposition arm: stock vLLM (no adapter), LMCache with TempoKV's
    ``retain`` and read TTL: the stock arm's command lines but for those two options."""
    spec, _raw = load(LADDERS[0])
    stock, _ = deployment_for(spec, tmp_path / "a", with_adapter=False)
    opts = L1Options("retain", 600)
    retain, _ = deployment_for(spec, tmp_path / "b", with_adapter=False, l1=opts)

    def plain(seen: dict[str, tuple], d: Path) -> dict[str, tuple]:  # the folders as ""
        return {name: ([x.replace(str(d), "") for x in argv],
                       {k: v.replace(str(d), "") for k, v in env.items()})
                for name, (argv, env) in seen.items()}  # fmt: skip

    a = plain(launches(stock.stack, monkeypatch), tmp_path / "a")
    b = plain(launches(retain.stack, monkeypatch), tmp_path / "b")
    assert b["vllm"] == a["vllm"] and "--scheduler-cls" not in b["vllm"][0]
    assert b["lmcache"][1] == a["lmcache"][1]
    base, got = a["lmcache"][0], b["lmcache"][0]
    at = got.index("--l2-prefetch-policy")
    assert got[at : at + 4] == ["--l2-prefetch-policy", "retain", "--l1-read-ttl-seconds", "600"]
    assert got[:at] + got[at + 4 :] == base


def test_a_deployment_the_run_cannot_extend_is_refused(tmp_path: Path) -> None:
    from bsrctl.errors import BadInput

    spec = TempoKVSpec.model_validate({
        "models": [{"name": "llama-3.1-8b"}],
        "serving": {"stack": {"kind": "attach", "attach": {
            "vllm_url": "http://127.0.0.1:1", "lmcache_url": "tcp://127.0.0.1:2",
            "lmcache_http_port": 3}}},
        "experiment": {"kind": "policies", "cache_ratios": [1.0]},
    })  # fmt: skip
    with pytest.raises(BadInput) as err:
        deployment_for(spec, tmp_path)
    assert "a substitute module or extension needs a launched stack" in str(err.value)


def _spec_on(stack: dict, **serving: object) -> TempoKVSpec:
    return TempoKVSpec.model_validate({
        "models": [{"name": "llama-3.1-8b"}],
        "serving": {"stack": stack, **serving},
        "experiment": {"kind": "policies", "cache_ratios": [1.0]},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("device", "asked", "cls"),
    [
        ("cpu", None, "TempoKVScheduler"),
        ("cpu", False, "TempoKVScheduler"),
        ("cuda", None, "TempoKVAsyncScheduler"),  # vLLM's default on CUDA
        ("cuda", True, "TempoKVAsyncScheduler"),
        ("cuda", False, "TempoKVScheduler"),
    ],
)
def test_the_adapter_class_is_vllms_scheduling(
    device: str, asked: bool | None, cls: str, tmp_path: Path
) -> None:
    spec = _spec_on({"device": device, "vllm": {"async_scheduling": asked}})
    dep, info = deployment_for(spec, tmp_path)
    tk = dep.stack.extensions.tempokv
    assert tk.scheduler_cls == info["scheduler_cls"] == f"bsrkv.vllm_ext.scheduler.{cls}"
    assert tk.async_scheduling is info["async_scheduling"] is (cls == "TempoKVAsyncScheduler")
    # a GPU engine shares no core with staging: the CPU bind is the CPU profile's alone
    bind = dep.stack.spec.vllm.cpu_threads_bind
    assert (bind is None) is (device == "cuda")


def test_async_scheduling_on_cpu_is_refused_naming_the_field(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:  # the spec itself refuses it (exit 2 at load)
        deployment_for(_spec_on({"vllm": {"async_scheduling": True}}), tmp_path)
    assert "stack.vllm.async_scheduling: true on device cpu" in str(err.value)
    assert "leave it unset there" in str(err.value)


def test_the_kv_geometry_is_the_deployments_registration(tmp_path: Path) -> None:
    # the preset of the served model, and a declared one: the adapter's KV bytes per token
    _dep, info = deployment_for(_spec_on({}, registration="tiny-llama"), tmp_path)
    assert info["kv_bytes_per_token"] == 1024 == TinyModelRecipe().kv_bytes_per_token()
    declared = {
        "model": "m", "chunk_tokens": 256, "tp_size": 1, "aux_bytes": 0,
        "groups": [{"index": 0, "name": "attention"}],
        "tensors": [{"name": "kv", "shape": ["T", 2, 300], "dtype": "bfloat16", "group": 0}],
    }  # fmt: skip
    dep, info = deployment_for(_spec_on({}, registration=declared), tmp_path)
    assert info["kv_bytes_per_token"] == 1200  # 2 × 300 bf16 elements per token
    assert dep.stack.extensions.tempokv.adapter.kv_bytes_per_token == 1200
