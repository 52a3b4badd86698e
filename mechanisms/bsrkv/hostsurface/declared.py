"""The vLLM and LMCache names bsrkv uses, declared in one place.

``USES`` maps each module of bsrkv to what it reads of vLLM or LMCache, one entry a
name: ``module:Name`` (a module's attribute), ``module:Class.member`` (a class member: a
method, property, field, or what a method assigns to ``self``; its bases' count),
``module:Class.method(a, b)`` (and parameters it must have, in this order),
``module`` (the module itself), ``package:--flag`` (a launch flag). The imports are held
complete by the suite's test_declared.py (it scans bsrkv's sources; a harness declares its own
reads beside these);
members and flags are declared by hand where a hook reads or overrides them.

``CONNECTOR_USES`` is what LMCache's own MP connector (the class vLLM's ``LMCacheMPConnector``
resolves to by default) reads of vLLM, where a vLLM release is known to break it;
``KNOWN_BROKEN`` names such pairs and why. ``TESTED_WITH``: the versions bsrkv is tested
against; any other pair runs when its surface is complete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TESTED_WITH = {"vllm": "0.32.0", "lmcache": "0.5.6"}
CONNECTOR = "lmcache.integration.vllm.lmcache_mp_connector"

_ENTRY = re.compile(
    r"^(?P<module>[\w.]+)(?::(?P<name>--[\w-]+|[\w.]+)(?:\((?P<params>[\w, ]*)\))?)?$"
)


@dataclass(frozen=True)
class Name:
    """One name a module (``user``) reads of vLLM or LMCache."""

    module: str  # the module that defines it; for a flag, the package
    name: str  # "" the module itself; "A" an attribute; "A.b" a member of class A; "--x" a flag
    user: str
    params: tuple[str, ...] | None = None  # parameters it must have, in this order

    @property
    def package(self) -> str:
        return self.module.split(".")[0]

    @property
    def is_flag(self) -> bool:
        return self.name.startswith("--")

    def __str__(self) -> str:
        text = self.name if self.is_flag else ".".join(p for p in (self.module, self.name) if p)
        return text + (f"({', '.join(self.params)})" if self.params is not None else "")


@dataclass(frozen=True)
class BrokenPair:
    """A vLLM release (from ``vllm_from`` on) that breaks an LMCache release, and why."""

    vllm_from: str
    lmcache: str
    cause: str


def parse(user: str, entry: str) -> Name:
    """One ``USES`` entry as a ``Name``; a malformed entry is a ValueError naming it."""
    m = _ENTRY.match(entry)
    if m is None:
        raise ValueError(f"hostsurface: {user}: malformed entry {entry!r}")
    raw = m.group("params")
    params = tuple(p.strip() for p in raw.split(",") if p.strip()) if raw is not None else None
    return Name(m.group("module"), m.group("name") or "", user, params)


def names(uses: dict[str, tuple[str, ...]]) -> tuple[Name, ...]:
    return tuple(parse(user, e) for user, entries in uses.items() for e in entries)


OUTPUT = "vllm.v1.core.sched.output"
REQUEST = "vllm.v1.request"
LMC_ADAPTER = "lmcache.integration.vllm.vllm_multi_process_adapter"
CTX = "lmcache.v1.multiprocess.engine_context"
TRANSFER = "lmcache.v1.multiprocess.modules.lmcache_driven_transfer"
LOOKUP = "lmcache.v1.multiprocess.modules.lookup"
SCHEDULER = "vllm.v1.core.sched.scheduler"
HANDLER = "lmcache.v1.multiprocess.request_handler"

# What each of bsrkv's L2 adapters imports to register itself with LMCache (one file each).
_L2_ADAPTER = (
    "lmcache.lmcache_native:Bitmap",
    "lmcache.logging:init_logger",
    "lmcache.v1.distributed.api:ObjectKey",
    "lmcache.v1.distributed.internal_api:L2StoreResult",
    "lmcache.v1.distributed.l2_adapters.base:L2AdapterInterface",
    "lmcache.v1.distributed.l2_adapters.base:L2TaskId",
    "lmcache.v1.distributed.l2_adapters.config:L2AdapterConfigBase",
    "lmcache.v1.distributed.l2_adapters.config:register_l2_adapter_type",
    "lmcache.v1.distributed.l2_adapters.factory:register_l2_adapter_factory",
    "lmcache.v1.distributed.l2_adapters.fs_l2_adapter:_object_key_to_filename",
)
USES: dict[str, tuple[str, ...]] = {
    "bsrkv.lmcache_ext.adapters.fs": (
        *_L2_ADAPTER,
        "lmcache.v1.distributed.l2_adapters.fs_l2_adapter:FSL2Adapter",
    ),
    "bsrkv.lmcache_ext.adapters.fs_config": (
        "lmcache.v1.distributed.l2_adapters.fs_l2_adapter:FSL2AdapterConfig",
    ),
    "bsrkv.lmcache_ext.adapters.mooncake": (
        *_L2_ADAPTER,
        "lmcache.v1.distributed.l2_adapters.fs_l2_adapter:_FILE_EXT",
        "lmcache.v1.platform:create_event_notifier",
    ),
    "bsrkv.lmcache_ext.bsr.mp_storage": (
        "lmcache.lmcache_native",
        "lmcache.logging:init_logger",
        "lmcache.v1.distributed.api:MemoryLayoutDesc",
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.multiprocess.object_group_transfer:downsample_and_stage_block_ids",
        "lmcache.v1.multiprocess.object_group_transfer:transfer_kv_per_object_group",
    ),
    "bsrkv.lmcache_ext.bsr.readback": (
        "lmcache.lmcache_native",
        "lmcache.v1.memory_management:MemoryObjMetadata",
        "lmcache.v1.memory_management:TensorMemoryObj",
        "lmcache.v1.multiprocess.object_group_transfer:transfer_kv_per_object_group",
    ),
    "bsrkv.lmcache_ext.bsr.storage": (
        "lmcache.v1.distributed.api:GroupedObjectKeys",
        "lmcache.v1.distributed.api:MemoryLayoutDesc",
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.distributed.api:PrefetchHandle",
        "lmcache.v1.distributed.api:PrefetchLockMode",
        "lmcache.v1.distributed.api:PrefetchResult",
        "lmcache.v1.distributed.api:PrefetchTaskSpec",
        "lmcache.v1.distributed.storage_manager:StorageManager",
    ),
    "bsrkv.lmcache_ext.bsr.windows": (
        "lmcache.v1.distributed.api:MemoryLayoutDesc",
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.distributed.error:L1Error",
    ),
    "bsrkv.lmcache_ext.faults.adapter": (
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.distributed.l2_adapters.base:L2AdapterInterface",
        "lmcache.v1.distributed.l2_adapters.base:L2TaskId",
        "lmcache.v1.distributed.l2_adapters.config:L2AdapterConfigBase",
        "lmcache.v1.distributed.l2_adapters.config:register_l2_adapter_type",
        "lmcache.v1.distributed.l2_adapters.factory:create_l2_adapter_from_registry",
        "lmcache.v1.distributed.l2_adapters.factory:register_l2_adapter_factory",
        "lmcache.v1.platform:create_event_notifier",
    ),
    "bsrkv.lmcache_ext.faults.config": (
        "lmcache.v1.distributed.l2_adapters.config:L2AdapterConfigBase",
        "lmcache.v1.distributed.l2_adapters.config:get_l2_adapter_config_class",
    ),
    "bsrkv.lmcache_ext.faults.pump": (
        "lmcache.lmcache_native:Bitmap",
        "lmcache.logging:init_logger",
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.distributed.l2_adapters.base:L2AdapterInterface",
        "lmcache.v1.distributed.l2_adapters.base:L2TaskId",
        "lmcache.v1.platform.event_notifier:EventNotifier",
        "lmcache.v1.platform.event_notifier:consume_fd",
    ),
    "bsrkv.lmcache_ext.faults.rules": ("lmcache.v1.distributed.api:ObjectKey",),
    "bsrkv.lmcache_ext.faults.verify": (
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.distributed.l2_adapters.fs_l2_adapter:_object_key_to_filename",
    ),
    "bsrkv.lmcache_ext.server.guard": (
        "lmcache.v1.multiprocess.ext_server_module:server_module_handler",
    ),
    "bsrkv.lmcache_ext.server.holds": (
        "lmcache.v1.multiprocess.cache_control.key_resolver:resolve_grouped_object_keys",
    ),
    "bsrkv.lmcache_ext.server.layout": (
        "lmcache.v1.gpu_connector.kv_format.specs.registry:get_spec_class",
        f"{TRANSFER}:LMCacheDrivenTransferModule.context_entries_snapshot",
        f"{TRANSFER}:ContextEntry.cache_context",
    ),
    "bsrkv.lmcache_ext.server.lookup": (
        "lmcache.v1.distributed.api:ObjectKey",
        "lmcache.v1.distributed.api:ipc_key_to_grouped_object_keys",
        "lmcache.v1.multiprocess.custom_types:IPCCacheServerKey",
        f"{HANDLER}:HandlerType",
        f"{HANDLER}:request_handler",
        f"{HANDLER}:HandlerType.BLOCKING",
        f"{HANDLER}:request_handler(handler_type, requires_client_affinity)",
        f"{LOOKUP}:LookupModule.lookup(key, tp_size)",
        f"{LOOKUP}:LookupModule.query_prefetch_status(request_id)",
        f"{LOOKUP}:LookupModule.wait_prefetch_status(request_id, timeout)",
        f"{LOOKUP}:LookupModule.free_lookup_locks(key, tp_size)",
        f"{LOOKUP}:LookupModule.end_session(request_id)",
        "lmcache.v1.multiprocess.token_hasher:TokenHasher.compute_chunk_hashes",
        "lmcache.v1.multiprocess.session:SessionManager.get_or_create(request_id)",
    ),
    "bsrkv.lmcache_ext.server.module": (
        "lmcache.v1.multiprocess.ext_server_module:ExtServerModuleBuildContext",
    ),
    "bsrkv.lmcache_ext.server.retrieve": (
        "lmcache:torch_dev",
        "lmcache.v1.multiprocess.custom_types:IPCCacheServerKey",
        "lmcache.v1.multiprocess.native_completion:submit_callback_to_stream",
        f"{HANDLER}:HandlerType",
        f"{HANDLER}:request_handler",
        f"{TRANSFER}:LMCacheDrivenTransferModule.store(key, instance_id, gpu_block_ids, "
        "event_ipc_handle)",
        f"{TRANSFER}:LMCacheDrivenTransferModule.retrieve(key, instance_id, gpu_block_ids, "
        "event_ipc_handle, skip_first_n_tokens)",
        f"{TRANSFER}:LMCacheDrivenTransferModule.get_and_touch_context_entry(instance_id)",
    ),
    "bsrkv.lmcache_ext.server.state": (
        "lmcache.logging:init_logger",
        "lmcache.v1.distributed.api:MemoryLayoutDesc",
        "lmcache.v1.multiprocess.custom_types:IPCCacheServerKey",
        "lmcache.v1.multiprocess.ext_server_module:ExtServerModuleBuildContext",
        f"{TRANSFER}:LMCacheDrivenTransferModule",
        f"{LOOKUP}:LookupModule",
        "lmcache.v1.multiprocess.ext_server_module:ExtServerModuleBuildContext.server_context",
        "lmcache.v1.multiprocess.ext_server_module:ExtServerModuleBuildContext.config",
        "lmcache.v1.multiprocess.ext_server_module:ExtServerModuleBuildContext.modules",
        f"{CTX}:MPCacheServerContext.chunk_size",
        f"{CTX}:MPCacheServerContext.storage_manager",
        f"{CTX}:MPCacheServerContext.token_hasher",
        f"{CTX}:MPCacheServerContext.session_manager",
        f"{CTX}:MPCacheServerContext.layout_desc_registry",
        f"{CTX}:MPCacheServerContext.resolve_obj_keys",
        f"{CTX}:LayoutDescRegistry.find_group_layout_descs",
        f"{CTX}:LayoutDescRegistry.find_attn_desc(model_name, world_size)",
        "lmcache.v1.distributed.storage_manager:StorageManager.get_l1_usage",
        "lmcache.v1.distributed.storage_manager:StorageManager.clear(force)",
        "lmcache.v1.distributed.storage_manager:StorageManager.l2_adapters",
    ),
    "bsrkv.lmcache_ext.tempokv.component": (
        "lmcache.v1.multiprocess.custom_types:IPCCacheServerKey",
    ),
    "bsrkv.lmcache_ext.tempokv.device": ("lmcache.v1.distributed.api:ObjectKey",),
    "bsrkv.vllm_ext.scheduler": (
        "vllm.v1.core.sched.async_scheduler:AsyncScheduler",
        f"{SCHEDULER}:Scheduler",
        f"{REQUEST}:RequestStatus",
        f"{SCHEDULER}:Scheduler.schedule",
        f"{SCHEDULER}:Scheduler.update_from_output(scheduler_output, model_runner_output)",
        f"{SCHEDULER}:Scheduler.add_request(request)",
        f"{SCHEDULER}:Scheduler._free_request(request)",
        f"{SCHEDULER}:Scheduler.has_requests",
        f"{SCHEDULER}:Scheduler.get_kv_connector",
        f"{SCHEDULER}:Scheduler.waiting",
        f"{SCHEDULER}:Scheduler.kv_holding_waiting",
        f"{SCHEDULER}:Scheduler.running",
        f"{SCHEDULER}:Scheduler.requests",
        f"{SCHEDULER}:Scheduler.kv_cache_manager",
        f"{SCHEDULER}:Scheduler.max_num_running_reqs",
        f"{SCHEDULER}:Scheduler.max_num_scheduled_tokens",
        f"{SCHEDULER}:Scheduler.block_size",
        f"{SCHEDULER}:Scheduler.vllm_config",
        "vllm.v1.core.kv_cache_manager:KVCacheManager.block_pool",
        "vllm.v1.core.block_pool:BlockPool.get_num_free_blocks",
        f"{OUTPUT}:SchedulerOutput.num_scheduled_tokens",
        f"{OUTPUT}:SchedulerOutput.total_num_scheduled_tokens",
        f"{OUTPUT}:SchedulerOutput.scheduled_new_reqs",
        f"{OUTPUT}:SchedulerOutput.finished_req_ids",
        f"{OUTPUT}:NewRequestData.req_id",
        f"{REQUEST}:Request.request_id",
        f"{REQUEST}:Request.status",
        f"{REQUEST}:Request.num_prompt_tokens",
        f"{REQUEST}:Request.num_computed_tokens",
        f"{REQUEST}:Request.num_output_tokens",
        f"{REQUEST}:Request.num_output_placeholders",
        f"{REQUEST}:Request.is_prefill_chunk",
        f"{REQUEST}:Request.prompt_token_ids",
        f"{REQUEST}:Request.cache_salt",
        f"{REQUEST}:RequestStatus.WAITING_FOR_REMOTE_KVS",
        "vllm.config.vllm:VllmConfig.cache_config",
        "vllm.config.vllm:VllmConfig.scheduler_config",
        "vllm.config.vllm:VllmConfig.model_config",
        "vllm.config.cache:CacheConfig.num_gpu_blocks",
        "vllm.config.scheduler:SchedulerConfig.async_scheduling",
        "vllm.config.model:ModelConfig.model",
        f"{CONNECTOR}:LMCacheMPConnector.scheduler_adapter",
        f"{LMC_ADAPTER}:LMCacheMPSchedulerAdapter.model_name",
        f"{LMC_ADAPTER}:LMCacheMPSchedulerAdapter.world_size",
    ),
    "bsrkv.vllm_ext.transport": (
        "lmcache.v1.multiprocess.protocols.server_module:ServerModuleCallRequest",
        f"{LMC_ADAPTER}:LMCacheMPSchedulerAdapter.req_clients",
        "lmcache.v1.multiprocess.transport.base:RequestClient.server_module_call",
    ),
}

# What LMCache's connector reads of vLLM where a vLLM release removed it (lmcache 0.5.6:
# integration/vllm/lmcache_mp_connector.py, _process_cached_requests under build_connector_meta).
CONNECTOR_USES: dict[str, tuple[str, ...]] = {
    CONNECTOR: (f"{OUTPUT}:CachedRequestData.resumed_req_ids",),
}

KNOWN_BROKEN = (
    BrokenPair(
        "0.34",
        "0.5.6",
        "LMCache 0.5.6's MP connector (what vLLM's LMCacheMPConnector resolves to) reads "
        "CachedRequestData.resumed_req_ids in build_connector_meta, which vLLM 0.34 removed: "
        "the engine core dies on the first step with a running request",
    ),
)
DECLARED = names(USES)
CONNECTOR_DECLARED = names(CONNECTOR_USES)
