"""The vLLM and LMCache names the harness itself reads, declared beside bsrkv's.

bsrkv declares what its own modules read (``bsrkv.hostsurface.declared.USES``); this is the
same declaration for bsrctl's modules (registration from vLLM's config, the launch flags, the
storage stack's StorageManager, the ``bsr.*`` client). ``DECLARED`` is both, what ``bsrctl
doctor`` and ``make compat`` check against a vLLM or LMCache tree; the imports are held
complete by tests/bsrctl/hostsurface/test_declared.py (it scans both packages' sources).
"""

from __future__ import annotations

from bsrkv.hostsurface.declared import CONNECTOR, CONNECTOR_DECLARED, Name, names
from bsrkv.hostsurface.declared import DECLARED as MECHANISMS_DECLARED

USES: dict[str, tuple[str, ...]] = {
    "bsrctl.registration.dsv4_vllm": (
        "vllm.config:ModelConfig",
        "vllm.config:ParallelConfig",
        "vllm.config:VllmConfig",
        "vllm.config:set_current_vllm_config",
        "vllm.config.cache:CacheConfig",
        "vllm.config.vllm:get_layers_from_vllm_config",
        "vllm.distributed:init_distributed_environment",
        "vllm.distributed:initialize_model_parallel",
        "vllm.model_executor.layers.attention_layer_base:AttentionLayerBase",
        "vllm.models.deepseek_v4.cpu.cpu_sparse:_NoOpEvent",
        "vllm.models.deepseek_v4.nvidia.flashmla",
        "vllm.models.deepseek_v4.nvidia.model:_select_dsv4_attn_cls",
        "vllm.platforms.interface:Platform",
        "vllm.v1.attention.backends.utils:get_supported_kv_cache_layouts",
        "vllm.v1.attention.backends.utils:resolve_kv_cache_layout",
        "vllm.v1.core.kv_cache_utils:get_kv_cache_groups",
    ),
    "bsrctl.registration.from_vllm": (
        "vllm.config:ModelConfig",
        "vllm.config:ParallelConfig",
        "vllm.utils.torch_utils:kv_cache_dtype_str_to_dtype",
        "vllm.v1.kv_cache_interface:FullAttentionSpec",
        "vllm.v1.kv_cache_interface:MLAAttentionSpec",
        "vllm.v1.kv_cache_interface:SlidingWindowSpec",
    ),
    "bsrctl.stack.contracts.bsr_client": (
        "lmcache.v1.multiprocess.protocols.server_module:ServerModuleCallRequest",
        "lmcache.v1.multiprocess.transport.factory:RequestClientFactory",
    ),
    "bsrctl.stack.launch.profile": (
        "vllm:--gpu-memory-utilization",
        "vllm:--enforce-eager",
        "vllm:--async-scheduling",
        "vllm:--no-async-scheduling",
    ),
    "bsrctl.stack.launch.serving.commands": (
        "vllm:--model",
        "vllm:--host",
        "vllm:--port",
        "vllm:--max-model-len",
        "vllm:--dtype",
        "vllm:--seed",
        "vllm:--max-num-seqs",
        "vllm:--enable-prompt-tokens-details",
        "vllm:--kv-cache-dtype",
        "vllm:--num-gpu-blocks-override",
        "vllm:--tensor-parallel-size",
        "vllm:--no-enable-prefix-caching",
        "vllm:--kv-transfer-config",
        "vllm:--scheduler-cls",
        "lmcache:--host",
        "lmcache:--port",
        "lmcache:--http-host",
        "lmcache:--http-port",
        "lmcache:--chunk-size",
        "lmcache:--l1-size-gb",
        "lmcache:--l1-devdax-path",
        "lmcache:--no-l1-use-lazy",
        "lmcache:--eviction-policy",
        "lmcache:--l2-adapter",
        "lmcache:--l2-prefetch-policy",
        "lmcache:--l1-read-ttl-seconds",
        "lmcache:--separate-object-groups",
        "lmcache:--supported-transfer-mode",
        "lmcache:--disable-metrics",
        "lmcache:--disable-observability",
        "lmcache:--server-module",
        "vllm.distributed.kv_transfer.kv_connector.factory",
        f"{CONNECTOR}",
    ),
    "bsrctl.stack.measure.tiers": ("lmcache.v1.multiprocess.token_hasher:TokenHasher",),
    "bsrctl.stack.storage.destinations": ("lmcache.v1.distributed.api:ObjectKey",),
    "bsrctl.stack.storage.l2": (
        "lmcache.v1.distributed.config:EvictionConfig",
        "lmcache.v1.distributed.config:L1ManagerConfig",
        "lmcache.v1.distributed.config:L1MemoryManagerConfig",
        "lmcache.v1.distributed.config:StorageManagerConfig",
        "lmcache.v1.distributed.l2_adapters.config:L2AdaptersConfig",
        "lmcache.v1.distributed.l2_adapters.fs_l2_adapter:FSL2AdapterConfig",
    ),
    "bsrctl.stack.storage.ranks": (
        "lmcache.v1.distributed.api:MemoryLayoutDesc",
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.distributed.storage_manager:StorageManager",
    ),
    "bsrctl.stack.storage.seeding": (
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.distributed.storage_manager:StorageManager",
    ),
    "bsrctl.stack.storage.stack": (
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.distributed.config:StorageManagerConfig",
        "lmcache.v1.distributed.l2_adapters.fs_l2_adapter:_object_key_to_filename",
        "lmcache.v1.distributed.storage_manager:StorageManager",
    ),
}

HARNESS_DECLARED = names(USES)
# everything a host tree must have for bsrkv and bsrctl to run on it
DECLARED: tuple[Name, ...] = MECHANISMS_DECLARED + HARNESS_DECLARED
__all__ = ["CONNECTOR_DECLARED", "DECLARED", "HARNESS_DECLARED", "USES"]
