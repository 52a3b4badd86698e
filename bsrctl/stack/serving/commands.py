"""The one home of the serving stack's command lines and environments: the LMCache MP server,
vLLM behind LMCache's connector, and a plain vLLM with no connector (canonical outputs)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bsrctl.specs import LmcacheSpec, VllmSpec

VENV_BIN = Path(sys.executable).parent
# vLLM's connector gives up on a server request after this; BSR's whole retrieve must end
# (installed or failed closed) well before it, or a late window overwrites the recompute.
MQ_TIMEOUT_S = 60.0


def base_env() -> dict[str, str]:
    """Telemetry off, loopback only, bounded CPU KV cache (STACK-NOTES)."""
    return {
        "LMCACHE_TRACK_USAGE": "false",
        "LMCACHE_DISABLE_BANNER": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def lmcache_command(
    lm: LmcacheSpec,
    port: int,
    http_port: int,
    l1_size_bytes: int,
    l2_adapters: Sequence[dict[str, Any]],
    server_module: dict[str, Any],
    prefetch_policy: str | None = None,
    read_ttl_s: int | None = None,
) -> list[str]:
    """``lmcache server`` on loopback with these L2 adapters and server module. TempoKV
    adds the ``retain`` prefetch policy (staged objects stay in L1 once unpinned, for the
    stock lookup) and a read-lock TTL above its longest protection (pins never lapse)."""
    argv = [
        str(VENV_BIN / "lmcache"),
        "server",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--l1-size-gb", repr(l1_size_bytes / (1 << 30)),
        "--no-l1-use-lazy",
        "--eviction-policy", "LRU",
        "--chunk-size", str(lm.chunk_size),
        "--http-host", "127.0.0.1",
        "--http-port", str(http_port),
        "--disable-observability",
        "--disable-metrics",
        "--supported-transfer-mode", "auto",
    ]  # fmt: skip
    if lm.separate_object_groups:
        argv.append("--separate-object-groups")
    for adapter in l2_adapters:
        argv += ["--l2-adapter", json.dumps(adapter)]
    if prefetch_policy is not None:
        argv += ["--l2-prefetch-policy", prefetch_policy]
    if read_ttl_s is not None:
        argv += ["--l1-read-ttl-seconds", str(read_ttl_s)]
    return [*argv, "--server-module", json.dumps(server_module)]


def vllm_command(
    v: VllmSpec,
    model_dir: Path,
    port: int,
    lmcache_port: int | None = None,
    scheduler_cls: str | None = None,
) -> list[str]:
    """vLLM's OpenAI server, greedy and deterministic. With ``lmcache_port`` it loads and
    stores KV through LMCache's MP connector (a failed load recomputes); without, it is a
    plain vLLM with no connector and no prefix cache (canonical outputs). With
    ``scheduler_cls`` (TempoKV's runtime adapter) vLLM schedules with that subclass."""
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enforce-eager",
        "--max-model-len", str(v.max_model_len),
        "--dtype", v.dtype,
        "--seed", "0",
        "--max-num-seqs", str(v.max_num_seqs),
        "--enable-prompt-tokens-details",
    ]  # fmt: skip
    if v.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", v.kv_cache_dtype]
    if lmcache_port is None:
        return [*argv, "--no-enable-prefix-caching"]
    kv = {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": lmcache_port,
            "lmcache.mp.mp_transfer_mode": "lmcache_driven",
            "lmcache.mp.mq_timeout": MQ_TIMEOUT_S,
        },
    }
    if scheduler_cls is not None:
        argv += ["--scheduler-cls", scheduler_cls]
    return [
        *argv,
        "--tensor-parallel-size", str(v.tensor_parallel_size),
        "--kv-transfer-config", json.dumps(kv),
    ]  # fmt: skip


def vllm_env(v: VllmSpec, cache_root: Path, connector: bool = True) -> dict[str, str]:
    """vLLM's environment; with the connector also the dev routes (/reset_prefix_cache makes
    vLLM forget locally) and, with TP > 1, one CPU per rank."""
    env = {
        **base_env(),
        "VLLM_CPU_KVCACHE_SPACE": str(v.kvcache_space_gib),
        "VLLM_CACHE_ROOT": str(cache_root),
    }
    if v.cpu_threads_bind is not None and v.tensor_parallel_size == 1:
        # canonical and served vLLM alike: a different thread count may change float sums
        env["VLLM_CPU_OMP_THREADS_BIND"] = v.cpu_threads_bind
    if not connector:
        return env
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if v.tensor_parallel_size > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
            str(i % (os.cpu_count() or 1)) for i in range(v.tensor_parallel_size)
        )
    return env
