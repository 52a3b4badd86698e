"""The device profile: every device-specific flag and variable, from ``stack.device`` alone.
CPU numerics and keys unchanged; cuda: auto dtype, GPU share, CUDA graphs, the GPUs, NCCL on
loopback; Mooncake's transport from the spec."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from bsrctl.errors import BadInput
from bsrctl.specs import (
    LmcacheSpec,
    MooncakeSpec,
    StackSpec,
    TargetSpec,
    VllmSpec,
    load_stack_section,
    select_stack,
)
from bsrctl.stack.launch import profile
from bsrctl.stack.launch.serving.mooncake import (
    MooncakeEndpoints,
    Transport,
    adapter_params,
    node_argv,
)
from bsrctl.stack.measure.canonical_outputs import numerics_key


def _spec(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def test_cpu_profile_is_the_cpu_stack_as_before() -> None:
    stack = StackSpec()
    assert stack.vllm.dtype == "float32"  # the cpu default: the canonical key is unchanged
    assert numerics_key(stack.vllm) == "float32-kvauto-tp1-len20480"
    p = profile.profile_of(stack)
    assert (p.device, p.vllm_flags) == ("cpu", ("--enforce-eager",))
    assert dict(p.vllm_env) == {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    assert dict(p.lmcache_env) == {}
    assert (profile.enforce_eager(stack), profile.async_scheduling(stack)) == (True, False)


def test_lmcache_cpu_threads_set_the_servers_openmp_threads_and_nothing_of_vllms() -> None:
    base = StackSpec()
    one = StackSpec(lmcache=LmcacheSpec(cpu_threads=1))
    assert dict(profile.profile_of(one).lmcache_env) == {"OMP_NUM_THREADS": "1"}
    assert profile.profile_of(one).vllm_env == profile.profile_of(base).vllm_env
    with pytest.raises(ValidationError):
        LmcacheSpec(cpu_threads=0)


def test_cpu_eager_can_be_turned_off_and_binds_cores_per_rank() -> None:
    off = StackSpec(vllm=VllmSpec(enforce_eager=False, cpu_threads_bind="0"))
    assert profile.profile_of(off).vllm_flags == ()
    assert dict(profile.profile_of(off).vllm_env) == {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "0",
    }


def test_cpu_one_rank_runs_its_worker_in_the_engine_core_two_ranks_keep_the_mp_executor() -> None:
    one = dict(profile.profile_of(StackSpec()).vllm_env)
    two = dict(profile.profile_of(StackSpec(vllm=VllmSpec(tensor_parallel_size=2))).vllm_env)
    assert one["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # vLLM's UniProcExecutor, as on a GPU
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in two  # one spawned worker per rank
    assert two["VLLM_CPU_OMP_THREADS_BIND"] == "|".join(
        str(i % (os.cpu_count() or 1)) for i in range(2)
    )


def test_cuda_profile_defaults() -> None:
    stack = StackSpec(device="cuda")
    assert stack.vllm.dtype == "auto"  # the checkpoint's, not float32
    p = profile.profile_of(stack)
    # CUDA graphs (no eager); async scheduling explicit, so vLLM resolves what was decided
    assert p.vllm_flags == ("--gpu-memory-utilization", "0.9", "--async-scheduling")
    assert dict(p.vllm_env) == {
        "CUDA_VISIBLE_DEVICES": "0",
        "NCCL_SOCKET_IFNAME": "lo",
        "VLLM_BATCH_INVARIANT": "1",  # the tiny Llama: unquantized, no fp8 KV, dense attention
    }
    off = profile.profile_of(StackSpec(device="cuda", vllm=VllmSpec(batch_invariant=False)))
    assert "VLLM_BATCH_INVARIANT" not in off.vllm_env
    assert dict(p.lmcache_env) == {"CUDA_VISIBLE_DEVICES": "0"}
    assert (profile.enforce_eager(stack), profile.async_scheduling(stack)) == (False, True)


@pytest.mark.parametrize(
    ("vllm", "flags", "async_on"),
    [
        ({"enforce_eager": True}, ("--enforce-eager", "--async-scheduling"), True),
        ({"async_scheduling": True}, ("--async-scheduling",), True),
        ({"async_scheduling": False}, ("--no-async-scheduling",), False),
        ({"gpu_memory_utilization": 0.8, "enforce_eager": False}, ("--async-scheduling",), True),
    ],
)
def test_cuda_profile_fields(vllm: dict, flags: tuple[str, ...], async_on: bool) -> None:
    stack = StackSpec(device="cuda", vllm=VllmSpec(**vllm))
    util = str(vllm.get("gpu_memory_utilization", 0.9))
    assert profile.profile_of(stack).vllm_flags == ("--gpu-memory-utilization", util, *flags)
    assert profile.async_scheduling(stack) is async_on


def test_the_gpus_are_one_per_rank() -> None:
    two = StackSpec(device="cuda", vllm=VllmSpec(tensor_parallel_size=2))
    assert profile.profile_of(two).vllm_env["CUDA_VISIBLE_DEVICES"] == "0,1"
    chosen = StackSpec(device="cuda", vllm=VllmSpec(tensor_parallel_size=2, gpus=[3, 2]))
    assert profile.gpus(chosen.vllm) == (3, 2)
    assert dict(profile.profile_of(chosen).lmcache_env) == {"CUDA_VISIBLE_DEVICES": "3,2"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "device: cuda\n  vllm: {tensor_parallel_size: 2, gpus: [0]}",
            "stack.vllm.gpus: Value error, 1 GPU(s) [0] for tensor_parallel_size 2",
        ),
        ("device: cuda\n  vllm: {gpus: [1, 1]}", "stack.vllm.gpus: Value error, 2 GPU(s)"),
        ("vllm: {gpus: [0]}", "stack.vllm.gpus names GPUs but stack.device is cpu"),
        ("vllm: {async_scheduling: true}", "async_scheduling: true on device cpu"),
        ("device: tpu", "stack.device: Input should be 'cpu' or 'cuda'"),
    ],
)
def test_incoherent_device_fields_are_bad_input(tmp_path: Path, text: str, needle: str) -> None:
    path = _spec(tmp_path, f"stack:\n  {text}\n")
    with pytest.raises(BadInput) as err:
        load_stack_section(path)
    assert needle in str(err.value)


def test_the_dtype_resolves_once_from_yaml_and_survives_a_reparse(tmp_path: Path) -> None:
    stack, _ = load_stack_section(_spec(tmp_path, "stack:\n  device: cuda\n"))
    assert stack.vllm.dtype == "auto"
    kept, _ = load_stack_section(_spec(tmp_path, "stack: {device: cuda, vllm: {dtype: float32}}"))
    assert kept.vllm.dtype == "float32"  # an explicit dtype is the user's
    assert StackSpec.model_validate(stack.model_dump()).vllm.dtype == "auto"
    cpu = StackSpec(vllm=VllmSpec(dtype="bfloat16"))
    assert cpu.vllm.dtype == "bfloat16"
    # --stack re-validates the dumped spec: the resolved dtype stays
    spec = select_stack(TargetSpec(stack=stack), "storage", ("serving", "storage"))
    assert (spec.stack.kind, spec.stack.vllm.dtype) == ("storage", "auto")


def test_the_mooncake_node_and_client_take_the_spec_transport() -> None:
    ep = MooncakeEndpoints(rpc_port=1, metrics_port=2, node_port=3)
    rdma = Transport.of(MooncakeSpec(protocol="rdma", rdma_devices=["mlx5_0", "mlx5_1"]))
    assert node_argv(Path("/mc/mooncake_client"), ep, "1024", rdma) == [
        "/mc/mooncake_client", "--host=127.0.0.1", "--port=3", "--global_segment_size=1024",
        "--local_buffer_size=0", "--protocol=rdma", "--device_names=mlx5_0,mlx5_1",
        "--master_server_address=127.0.0.1:1", "--metadata_server=P2PHANDSHAKE",
    ]  # fmt: skip
    assert adapter_params(ep, rdma) == {
        "master_server_address": "127.0.0.1:1",
        "protocol": "rdma",
        "rdma_devices": "mlx5_0,mlx5_1",
        "register_l1": True,
    }
    tcp = Transport.of(MooncakeSpec())
    assert node_argv(Path("/mc/mooncake_client"), ep, "1024", tcp)[5] == "--protocol=tcp"
    assert "--device_names" not in " ".join(node_argv(Path("/b"), ep, "1", tcp))
    assert adapter_params(ep, tcp) == {"master_server_address": "127.0.0.1:1"}  # as before
