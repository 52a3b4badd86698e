"""The one home of the serving stack's command lines and environments: the LMCache MP server,
vLLM behind LMCache's connector, and the reference vLLM with no connector (canonical outputs).

Each process is a ``Launch`` (name, argv, the environment bsrctl sets) built from the spec and
the ``Slots`` chosen when it starts (ports, folders, the namespace prefix): the stack fills the
slots with what it picked and starts the launch; ``bsrctl stack plan`` fills them with stable
placeholders and prints it. What depends on the device comes from
``bsrctl.stack.launch.profile``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bsrctl.specs import LmcacheSpec, StackSpec
from bsrctl.stack.launch.profile import profile_of
from bsrctl.trace.collect import BSP_DELAY_MS
from bsrkv.control_token import CONTROL_TOKEN_ENV

if TYPE_CHECKING:
    from bsrctl.stack.launch.extensions import LMCacheExtensions

VENV_BIN = Path(sys.executable).parent
# vLLM's connector gives up on a server request after this; BSR's whole retrieve must end
# (installed or failed closed) well before it, or a late window overwrites the recompute.
MQ_TIMEOUT_S = 60.0
Port = int | str  # a port, or a plan's placeholder for one picked at start ("<vllm.port>")


@dataclass(frozen=True)
class Launch:
    """One process as it is started: its name, command line and the variables bsrctl sets
    (over its own environment)."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "argv": list(self.argv), "env": dict(self.env)}


@dataclass(frozen=True)
class Slots:
    """What a deployment's command lines take that is chosen when it starts: the ports (by
    spec field: ``lmcache.port``, ``lmcache.http_port``, ``vllm.port``), the stack's folder,
    the model folder, the prefix that enters the stack's network namespace, and the Mooncake
    adapter's parameters (its master's endpoint)."""

    ports: Mapping[str, Port]
    stack_dir: Path
    model_dir: Path | None  # None until prepared (LMCache needs none)
    prefix: tuple[str, ...] = ()
    mooncake_params: Mapping[str, Any] | None = field(default=None)
    otlp: str | None = None  # the trace receiver's OTLP/gRPC target (None: tracing off)
    control_token: str | None = None  # the server module's (a plan: a placeholder)
    # the flash tier (``stack/launch/fast_tier.py``): LMCache's L1 arena, and the argv prefix that
    # starts the server inside its cgroups
    devdax_path: str | None = None
    lmcache_prefix: tuple[str, ...] = ()


def base_env() -> dict[str, str]:
    """Every process's: telemetry off, loopback only, offline (docs/architecture/stack.md)."""
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
    port: Port,
    http_port: Port,
    l1_size_bytes: int,
    l2_adapters: Sequence[dict[str, Any]],
    server_module: dict[str, Any],
    prefetch_policy: str | None = None,
    read_ttl_s: int | None = None,
    devdax_path: str | None = None,
) -> list[str]:
    """``lmcache server`` on loopback with these L2 adapters and server module. TempoKV
    adds the ``retain`` prefetch policy (staged objects stay in L1 once unpinned, for the
    stock lookup) and a read-lock TTL above its longest protection (pins never lapse).
    ``devdax_path``: the whole L1 is that arena (LMCache's Device-DAX L1, which needs
    ``--no-l1-use-lazy`` and no SHM name: the server's default)."""
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
    if devdax_path is not None:
        argv += ["--l1-devdax-path", devdax_path]
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
    stack: StackSpec,
    model_dir: Path,
    port: Port,
    lmcache_port: Port | None = None,
    scheduler_cls: str | None = None,
) -> list[str]:
    """vLLM's OpenAI server, greedy and deterministic, with the device's flags. With
    ``lmcache_port`` it loads and stores KV through LMCache's MP connector (a failed load
    recomputes); without, it is the reference: no connector and no prefix cache, at the
    served deployment's TP, dtype and KV cache dtype (same numerics). With ``scheduler_cls``
    (TempoKV's runtime adapter) vLLM schedules with that subclass."""
    v = stack.vllm
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        *profile_of(stack).vllm_flags,
        "--max-model-len", str(v.max_model_len),
        "--dtype", v.dtype,
        "--seed", "0",
        "--max-num-seqs", str(v.max_num_seqs),
        "--enable-prompt-tokens-details",
    ]  # fmt: skip
    if v.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", v.kv_cache_dtype]
    if v.num_gpu_blocks_override is not None:
        argv += ["--num-gpu-blocks-override", str(v.num_gpu_blocks_override)]
    tp = ["--tensor-parallel-size", str(v.tensor_parallel_size)]
    if lmcache_port is None:
        return [*argv, *tp, "--no-enable-prefix-caching"]
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
    if v.connector == "lmcache":  # LMCache's own, SupportsHMA (integration/vllm/...:535)
        kv["kv_connector_module_path"] = "lmcache.integration.vllm.lmcache_mp_connector"
    if scheduler_cls is not None:
        argv += ["--scheduler-cls", scheduler_cls]
    return [*argv, *tp, "--kv-transfer-config", json.dumps(kv)]


def vllm_env(stack: StackSpec, cache_root: Path, connector: bool = True) -> dict[str, str]:
    """vLLM's environment: the device's variables, a private cache root; with the connector
    also the dev routes (/reset_prefix_cache makes vLLM forget locally)."""
    env = {
        **base_env(),
        **profile_of(stack).vllm_env,
        "VLLM_CACHE_ROOT": str(cache_root),
    }
    if connector:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


# ---- the launches: what the stack starts and `stack plan` prints --------------------------


def l2_adapter_specs(
    stack: StackSpec, ext: LMCacheExtensions, slots: Slots
) -> list[dict[str, Any]]:
    """bsrctl's own L2 adapters, each behind the fault wrapper (inert until a rule is armed
    through its control file), so failure matrices inject by real means."""
    out: list[dict[str, Any]] = []
    if stack.lmcache.fs_l2:
        out.append(ext.fs_adapter(slots.stack_dir / "l2-fs", fault_control(slots, "fs")))
    if stack.mooncake.enabled and slots.mooncake_params is not None:
        params = dict(slots.mooncake_params)
        out.append(ext.mooncake_adapter(params, fault_control(slots, "mooncake")))
    return out


def fault_control(slots: Slots, tier: str) -> Path:
    """The file a tier's fault wrapper re-reads: write rules there to inject faults."""
    return slots.stack_dir / f"faults-{tier}.json"


def lmcache_launch(
    stack: StackSpec, ext: LMCacheExtensions, slots: Slots, l1_size_bytes: int
) -> Launch:
    """The LMCache MP server with ``ext``'s server module and L2 adapters and L1 options
    (TempoKV's: the ``retain`` prefetch policy, a read-lock TTL above its longest protection)."""
    l1 = ext.l1_options
    argv = lmcache_command(
        stack.lmcache,
        slots.ports["lmcache.port"],
        slots.ports["lmcache.http_port"],
        l1_size_bytes,
        l2_adapter_specs(stack, ext, slots),
        ext.server_module.to_json(),
        prefetch_policy=l1.prefetch_policy,
        read_ttl_s=l1.read_ttl_s,
        devdax_path=slots.devdax_path,
    )
    env = {**base_env(), **profile_of(stack).lmcache_env, **token_env(slots)}
    if ext.server_module.pythonpath:  # a server module from outside the installed package
        env["PYTHONPATH"] = ext.server_module.server_pythonpath(os.environ.get("PYTHONPATH"))
    argv = [*slots.prefix, *slots.lmcache_prefix, *argv]
    return with_tracing(Launch("lmcache", tuple(argv), env), slots.otlp)


def vllm_launch(stack: StackSpec, ext: LMCacheExtensions | None, slots: Slots) -> Launch:
    """The served vLLM behind LMCache's connector (TempoKV: its scheduler and settings)."""
    tk = ext.tempokv if ext is not None else None
    assert slots.model_dir is not None, "vLLM's model folder is prepared before it starts"
    argv = vllm_command(
        stack,
        slots.model_dir,
        slots.ports["vllm.port"],
        lmcache_port=slots.ports["lmcache.port"],
        scheduler_cls=tk.scheduler_cls if tk is not None else None,
    )
    env = vllm_env(stack, slots.stack_dir / "vllm-cache")
    if tk is not None:  # its tempokv.update calls are mutating: they carry the token
        env.update(tk.vllm_env(), **token_env(slots))
    return with_tracing(Launch("vllm", (*slots.prefix, *argv), env), slots.otlp)


def token_env(slots: Slots) -> dict[str, str]:
    """The control token, in the environment (never on a command line: ``ps`` shows those)."""
    return {CONTROL_TOKEN_ENV: slots.control_token} if slots.control_token else {}


def with_tracing(launch: Launch, endpoint: str | None) -> Launch:
    """``launch`` exporting its spans to bsrctl's receiver at ``endpoint`` (OTLP/gRPC).

    vLLM: ``--otlp-traces-endpoint`` (vllm/config/observability.py:38), gRPC being its
    exporter's default protocol (vllm/tracing/otel.py:94-101). LMCache: its observability
    bus on with only the span subscribers (``--enable-tracing``, ``--otlp-endpoint``:
    lmcache/v1/mp_observability/config.py:157-171; metrics stay off, logging subscribers
    too, as with ``--disable-observability``). The server module exports its own spans to
    ``$BSRKV_OTLP_ENDPOINT``. Every batch processor exports after ``BSP_DELAY_MS``, not 5 s."""
    if endpoint is None:
        return launch
    env = {
        **launch.env,
        "OTEL_SERVICE_NAME": launch.name,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        "OTEL_BSP_SCHEDULE_DELAY": str(BSP_DELAY_MS),  # the server module's exporter too
        "BSRKV_OTLP_ENDPOINT": endpoint,
    }
    argv = list(launch.argv)
    if launch.name == "lmcache":
        at = argv.index("--server-module")
        argv = [a for a in argv[:at] if a != "--disable-observability"] + [
            "--disable-logging", "--enable-tracing", "--otlp-endpoint", endpoint, *argv[at:]
        ]  # fmt: skip
    else:
        argv += ["--otlp-traces-endpoint", endpoint]
    return Launch(launch.name, tuple(argv), env)


def reference_launch(stack: StackSpec, model_dir: Path, port: Port, stack_dir: Path) -> Launch:
    """The reference vLLM of canonical outputs: no connector, no namespace (no Mooncake), the
    served deployment's numerics."""
    argv = vllm_command(stack, model_dir, port)
    env = vllm_env(stack, stack_dir / "vllm-cache", connector=False)
    return Launch("vllm-reference", tuple(argv), env)
