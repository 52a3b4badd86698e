"""`bsrctl stack plan`: the exact command lines and environments of the shipped specs' processes,
built by the launchers' own builders (the stack starts what the plan prints), and the figures;
nothing started, no GPU, no model but its config.json.

The ``--server-module`` config is RestoreSettings' own (its fields belong to bsrkv.settings):
the expected value is computed from the spec's settings at W = 0; everything else is literal.
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.errors import BadInput
from bsrctl.spec_io import read_yaml
from bsrctl.specs import TargetSpec, VllmSpec, model_config
from bsrctl.stack.launch import tinymodel
from bsrctl.stack.launch.extensions import bsr_extensions
from bsrctl.stack.launch.netns import NetNamespace
from bsrctl.stack.launch.plan import Plan, plan_spec
from bsrctl.stack.launch.process import Supervised
from bsrctl.stack.launch.serving import ServingStack
from bsrctl.stack.launch.serving.commands import VENV_BIN, base_env
from bsrctl.stack.launch.serving.mooncake import (
    MooncakeEndpoints,
    MooncakeStack,
    Transport,
    mooncake_dir,
)
from bsrkv.settings import RestoreTuning

# the launched server module's control token: in LMCache's environment, never its argv
TOKEN = {"BSRKV_CONTROL_TOKEN": "<control-token>"}

ROOT = Path(__file__).resolve().parents[3]
PY = sys.executable
API = [PY, "-m", "vllm.entrypoints.openai.api_server"]
LMCACHE = str(VENV_BIN / "lmcache")
MC = mooncake_dir() or Path("<mooncake>")
NETNS = ["nsenter", "-t", "<netns.pid>", "-n", "--"]


@pytest.fixture(autouse=True)
def _cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BSRCTL_CACHE", "/cache")  # where the tiny model would be built
    monkeypatch.chdir(ROOT)  # the specs name config.json files relative to the checkout


def _plan(name: str) -> Plan:
    return plan_spec(ROOT / "ladders" / name)


def _module(name: str) -> str:
    doc = read_yaml(ROOT / "ladders" / name)
    settings = RestoreTuning.model_validate(doc.get("restore", {}))
    spec = TargetSpec(restore=settings)
    return json.dumps(bsr_extensions(spec.settings(0)).server_module.to_json())


def _fs(run: str = "<run>") -> str:
    return json.dumps({
        "type": "plugin",
        "module_path": "bsrkv.lmcache_ext.faults.adapter",
        "class_name": "BsrFaultL2Adapter",
        "adapter_params": {
            "name": "fs",
            "control_path": f"{run}/stack/faults-fs.json",
            "inner": {
                "type": "bsr_fs",
                "base_path": f"{run}/stack/l2-fs",
                "load_concurrency": 1,
                "checksum": True,
                "checksum_algorithm": "xxh3_128",
            },
        },
    })  # fmt: skip


def _lmcache(l1_gb: str, adapters: list[str], module: str) -> list[str]:
    argv = [
        LMCACHE, "server", "--host", "127.0.0.1", "--port", "<lmcache.port>",
        "--l1-size-gb", l1_gb, "--no-l1-use-lazy", "--eviction-policy", "LRU",
        "--chunk-size", "256", "--http-host", "127.0.0.1", "--http-port", "<lmcache.http_port>",
        "--disable-observability", "--disable-metrics", "--supported-transfer-mode", "auto",
    ]  # fmt: skip
    for a in adapters:
        argv += ["--l2-adapter", a]
    return [*argv, "--server-module", module]


def _kv(module: str | None = None) -> str:
    """The --kv-transfer-config; with ``module`` LMCache's own connector (connector: lmcache)."""
    return json.dumps({
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": "<lmcache.port>",
            "lmcache.mp.mp_transfer_mode": "lmcache_driven",
            "lmcache.mp.mq_timeout": 60.0,
        },
        **({"kv_connector_module_path": module} if module else {}),
    })  # fmt: skip


def _by_name(plan: Plan) -> dict[str, Any]:
    return {p.name: p for p in plan.processes}


def test_cpu_e1_plan_is_the_cpu_stack() -> None:
    plan = _plan("cpu-e1.yaml")
    assert [p.name for p in plan.processes] == ["vllm-reference", "lmcache", "vllm"]
    ref, lm, vllm = plan.processes
    model = f"/cache/models/tiny-llama-{tinymodel.TinyModelRecipe().digest()[:16]}"
    head = [
        *API, "--model", model, "--host", "127.0.0.1",
    ]  # fmt: skip
    tail = [
        "--enforce-eager", "--max-model-len", "16640", "--dtype", "float32", "--seed", "0",
        "--max-num-seqs", "4", "--enable-prompt-tokens-details", "--tensor-parallel-size", "1",
    ]  # fmt: skip
    assert list(ref.argv) == [
        *head,
        "--port",
        "<vllm-reference.port>",
        *tail,
        "--no-enable-prefix-caching",
    ]
    assert dict(ref.env) == {
        **base_env(),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CACHE_ROOT": "<run>/canonical/stack/vllm-cache",
    }
    assert list(lm.argv) == _lmcache("0.0625", [_fs()], _module("cpu-e1.yaml"))
    assert dict(lm.env) == {**base_env(), **TOKEN}
    assert list(vllm.argv) == [*head, "--port", "<vllm.port>", *tail, "--kv-transfer-config", _kv()]
    assert dict(vllm.env) == {
        **base_env(),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CACHE_ROOT": "<run>/stack/vllm-cache",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    f = plan.figures
    assert (f["device"], f["c_bytes_per_rank"], f["l1_size_bytes"]) == ("cpu", 262_144, 64 << 20)
    assert f["w_c_bytes_per_rank"] == {"4": 1 << 20, "8": 2 << 20, "16": 4 << 20,
                                       "32": 8 << 20, "64": 16 << 20}  # fmt: skip
    assert f["largest_whole_plan"] == {
        "tokens": 16384, "chunks": 64, "bytes": 16 << 20, "fits_l1": True,
    }  # fmt: skip
    assert f["gpu_memory_per_rank"] is None


def test_gpu_1x_plan_is_a_cuda_deployment() -> None:
    plan = _plan("gpu-1x.yaml")
    ref, lm, vllm = plan.processes
    head = [*API, "--model", "/models/Llama-3.1-8B-Instruct", "--host", "127.0.0.1"]
    tail = [
        "--gpu-memory-utilization", "0.9", "--async-scheduling",
        "--max-model-len", "131072", "--dtype", "auto",
        "--seed", "0", "--max-num-seqs", "4", "--enable-prompt-tokens-details",
        "--tensor-parallel-size", "1",
    ]  # fmt: skip
    assert list(ref.argv) == [
        *head,
        "--port",
        "<vllm-reference.port>",
        *tail,
        "--no-enable-prefix-caching",
    ]
    assert list(vllm.argv) == [*head, "--port", "<vllm.port>", *tail, "--kv-transfer-config", _kv()]
    # an unquantized bf16 Llama: batch invariance holds on vLLM 0.32
    # (stack/launch/batch_invariance.py)
    cuda = {"CUDA_VISIBLE_DEVICES": "0", "NCCL_SOCKET_IFNAME": "lo", "VLLM_BATCH_INVARIANT": "1"}
    assert dict(ref.env) == {
        **base_env(),
        **cuda,
        "VLLM_CACHE_ROOT": "<run>/canonical/stack/vllm-cache",
    }
    assert dict(vllm.env) == {
        **base_env(), **cuda, "VLLM_CACHE_ROOT": "<run>/stack/vllm-cache",
        "VLLM_SERVER_DEV_MODE": "1",
    }  # fmt: skip
    for p in (ref, vllm):  # the "must show": no CPU flag or variable on cuda
        assert "--enforce-eager" not in p.argv
        assert not [k for k in p.env if k.startswith("VLLM_CPU_")]
    assert list(lm.argv) == _lmcache("24.0", [_fs()], _module("gpu-1x.yaml"))
    assert dict(lm.env) == {**base_env(), "CUDA_VISIBLE_DEVICES": "0", **TOKEN}
    f = plan.figures
    assert (f["registration"], f["dtype"], f["gpus"]) == ("Llama-3.1-8B-Instruct", "auto", [0])
    assert f["c_bytes_per_rank"] == 33_554_432  # 32 x 2 x 8 x 128 x 2 B x 256 tokens
    assert f["w_c_bytes_per_rank"]["32"] == 1 << 30
    assert f["largest_whole_plan"] == {
        "tokens": 130_048, "chunks": 508, "bytes": 17_045_651_456, "fits_l1": True,
    }  # fmt: skip
    assert f["gpu_memory_per_rank"] == {
        "gpu_memory_utilization": 0.9,
        "kv_bytes_per_token": 131_072,
        "kv_bytes_max_model_len": 131_072 * 131_072,
        "weights_bytes": 8_030_261_248 * 2,  # Llama-3.1-8B's parameters, bf16
    }


def test_dsv4_plan_is_tp2_with_mooncake_over_rdma() -> None:
    plan = _plan("dsv4-flash-tp2.yaml")
    assert [p.name for p in plan.processes] == [
        "vllm-reference", "mooncake-master", "mooncake-node", "lmcache", "vllm",
    ]  # fmt: skip
    procs = _by_name(plan)
    head = [*API, "--model", "/models/DeepSeek-V4-Flash", "--host", "127.0.0.1"]
    tail = [
        "--gpu-memory-utilization", "0.9", "--async-scheduling",
        "--max-model-len", "524288", "--dtype", "auto",
        "--seed", "0", "--max-num-seqs", "4", "--enable-prompt-tokens-details",
        "--tensor-parallel-size", "2",
    ]  # fmt: skip
    assert list(procs["vllm-reference"].argv) == [
        *head,
        "--port",
        "<vllm-reference.port>",
        *tail,
        "--no-enable-prefix-caching",
    ]
    assert list(procs["vllm"].argv) == [
        *NETNS,
        *head,
        "--port",
        "<vllm.port>",
        *tail,
        "--kv-transfer-config",
        _kv("lmcache.integration.vllm.lmcache_mp_connector"),  # DSV4's 5 KV cache groups
    ]
    # no VLLM_BATCH_INVARIANT: FP8 weights and sparse MLA are outside what it covers
    cuda = {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SOCKET_IFNAME": "lo"}
    assert dict(procs["vllm"].env) == {
        **base_env(), **cuda, "VLLM_CACHE_ROOT": "<run>/stack/vllm-cache",
        "VLLM_SERVER_DEV_MODE": "1",
    }  # fmt: skip
    assert list(procs["mooncake-master"].argv) == [
        *NETNS, str(MC / "mooncake_master"), "--rpc_address=127.0.0.1",
        "--rpc_port=<mooncake.rpc_port>", "--metrics_host=127.0.0.1",
        "--metrics_port=<mooncake.metrics_port>", "--enable_http_metadata_server=false",
    ]  # fmt: skip
    assert list(procs["mooncake-node"].argv) == [
        *NETNS, str(MC / "mooncake_client"), "--host=127.0.0.1",
        "--port=<mooncake.node_port>", "--global_segment_size=137438953472",
        "--local_buffer_size=0", "--protocol=rdma",
        "--master_server_address=127.0.0.1:<mooncake.rpc_port>",
        "--metadata_server=P2PHANDSHAKE",
    ]  # fmt: skip
    assert dict(procs["mooncake-master"].env) == dict(procs["mooncake-node"].env) == {}
    mooncake = json.dumps({
        "type": "plugin",
        "module_path": "bsrkv.lmcache_ext.faults.adapter",
        "class_name": "BsrFaultL2Adapter",
        "adapter_params": {
            "name": "mooncake",
            "control_path": "<run>/stack/faults-mooncake.json",
            "inner": {
                "type": "bsr_mooncake",
                "load_workers": 1,
                "master_server_address": "127.0.0.1:<mooncake.rpc_port>",
                "protocol": "rdma",
                "rdma_devices": "",
                "register_l1": True,
            },
            "verify": True,
            "checksum_algorithm": "xxh3_128",
            "checksum_dir": "<run>/stack/checksums-mooncake",
        },
    })  # fmt: skip
    module = _module("dsv4-flash-tp2.yaml")
    assert list(procs["lmcache"].argv) == [*NETNS, *_lmcache("16.0", [_fs(), mooncake], module)]
    assert dict(procs["lmcache"].env) == {**base_env(), "CUDA_VISIBLE_DEVICES": "0,1", **TOKEN}
    f = plan.figures
    assert (f["tensor_parallel_size"], f["gpus"], f["dtype"]) == (2, [0, 1], "auto")
    assert f["registration"] == "DeepSeek-V4-Flash"  # vLLM's caches, not the paper's preset
    assert f["c_bytes_per_rank"] == 83_436_096
    assert f["w_c_bytes_per_rank"]["32"] == 32 * 83_436_096 == 2_669_955_072
    assert f["l1_size_bytes"] == 16 << 30 >= 64 * 83_436_096 * 2  # the law's W = 64, both ranks
    assert f["gpu_memory_per_rank"]["weights_bytes"] is None  # MoE: not counted from config


class _Moon:
    """The running store's handle as the stack reads it: MooncakeStack's own adapter config
    over the plan's endpoints."""

    def __init__(self, stack: Any) -> None:
        self.endpoints = MooncakeEndpoints(
            "<mooncake.rpc_port>", "<mooncake.metrics_port>", "<mooncake.node_port>"
        )
        self.transport = Transport.of(stack.mooncake)

    def l2_adapter_config(self) -> dict[str, Any]:
        return MooncakeStack.l2_adapter_config(self)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["cpu-e1.yaml", "gpu-1x.yaml", "dsv4-flash-tp2.yaml"])
def test_the_stack_starts_what_the_plan_prints(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ServingStack, given the plan's placeholders as its picks, launches exactly the plan's
    LMCache and vLLM (the run folder and the holder's PID aside): one builder for both."""
    plan = _by_name(_plan(name))
    doc = read_yaml(ROOT / "ladders" / name)
    spec = TargetSpec.model_validate({k: doc[k] for k in ("stack", "restore") if k in doc})
    started: list[Supervised] = []
    monkeypatch.setattr(Supervised, "wait_healthy", lambda self, *a, **k: None)
    monkeypatch.setattr("bsrctl.stack.launch.serving.stack.maybe_inside", lambda ns: nullcontext())
    st = ServingStack(spec.stack, tmp_path, bsr_extensions(spec.settings(0)))
    assert re.fullmatch("[0-9a-f]{64}", st.control_token or "")  # its own, drawn per stack
    st.control_token = "<control-token>"  # the plan's placeholder for it
    monkeypatch.setattr(st, "_launch", started.append)
    st.ports = {k: f"<{k}>" for k in ("lmcache.port", "lmcache.http_port", "vllm.port")}  # type: ignore[misc]
    argv = plan["vllm"].argv
    st.model_dir = Path(argv[argv.index("--model") + 1])
    if spec.stack.mooncake.enabled:
        st.ns = NetNamespace(pid=4242)
        st.mooncake = _Moon(spec.stack)
    st.start_lmcache()
    st.start_vllm()

    def at_run(text: str) -> str:
        return text.replace("<run>", str(tmp_path)).replace("<netns.pid>", "4242")

    assert [(p.name, p.argv, p.env) for p in started] == [
        (n, [at_run(a) for a in plan[n].argv], {k: at_run(v) for k, v in plan[n].env.items()})
        for n in ("lmcache", "vllm")
    ]


def test_the_cli_prints_the_plan_as_json() -> None:
    res = CliRunner().invoke(app, ["stack", "plan", "ladders/gpu-1x.yaml", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert sorted(doc) == ["figures", "processes"]
    assert [p["name"] for p in doc["processes"]] == ["vllm-reference", "lmcache", "vllm"]
    assert [sorted(p) for p in doc["processes"]] == [["argv", "env", "name"]] * 3
    assert doc == _plan("gpu-1x.yaml").to_json()


def test_a_plan_of_a_model_not_here_needs_its_config_json(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "stack: {device: cuda, vllm: {model: /nowhere/m}}\nsweep: {sizes_tokens: [512]}\n"
    )
    res = CliRunner().invoke(app, ["stack", "plan", str(spec)])
    assert res.exit_code == 2
    assert "stack.vllm.model: cannot read /nowhere/m/config.json" in res.output


def test_the_model_folders_config_wins_over_the_shipped_copy(tmp_path: Path) -> None:
    shipped = ROOT / "ladders" / "models" / "Llama-3.1-8B-Instruct" / "config.json"
    off_node = VllmSpec(model=str(tmp_path / "absent"), config_json=shipped)
    assert model_config(off_node) == json.loads(shipped.read_text())
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"vocab_size": 7}')
    on_node = VllmSpec(model=str(tmp_path / "m"), config_json=shipped)
    assert model_config(on_node) == {"vocab_size": 7}  # what vLLM loads
    broken = VllmSpec(model=str(tmp_path / "absent"), config_json=tmp_path / "none.json")
    with pytest.raises(BadInput, match="stack.vllm.config_json: cannot read"):
        model_config(broken)


def test_a_plan_with_one_gpu_for_two_ranks_is_bad_input(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("stack: {device: cuda, vllm: {tensor_parallel_size: 2, gpus: [0]}}\n")
    res = CliRunner().invoke(app, ["stack", "plan", str(spec)])
    assert res.exit_code == 2
    assert "stack.vllm.gpus: Value error, 1 GPU(s) [0] for tensor_parallel_size 2" in res.output
