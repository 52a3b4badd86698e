"""bsrctl's LMCache extensions, as the stacks load them: the one stack module that names
``bsrkv.lmcache_ext`` (the server module, the L2 adapters, the fault wrapper's control file,
the restore storage over LMCache's StorageManager).

The stacks know nothing of BSR: ``ServingStack`` loads whatever ``LMCacheExtensions`` its
caller gives it, and ``bsr_extensions(settings)`` builds bsrctl's own from the restore
settings. Another server module (the failure matrix's test-only mutants) is a parameter:
``bsr_extensions(settings, module_path=..., extra_config={...})``.

TempoKV's launch (``TempoKVLaunch``) names the runtime adapter's scheduler class in vLLM,
matching vLLM's async scheduling as ``async_scheduling`` decides it once from the spec.

Everything of ``bsrkv.lmcache_ext`` is imported lazily: importing this module (and the
serving stack) imports no LMCache.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bsrctl.stack.launch.fast_tier import FastTierConfig
from bsrkv.settings import RestoreSettings

if TYPE_CHECKING:
    from bsrkv.registration import Registration
    from bsrkv.restore import RestoreStorage
    from bsrkv.tempokv.live import AdapterSettings

BSR_SERVER_MODULE = "bsrkv.lmcache_ext.server"
FAULT_ADAPTER_MODULE = "bsrkv.lmcache_ext.faults.adapter"
MOONCAKE_ADAPTER_MODULE = "bsrkv.lmcache_ext.adapters.mooncake"


@dataclass(frozen=True)
class ServerModule:
    """An LMCache ``--server-module``: the module LMCache imports, its factory, its config,
    and the folders the server process needs first on its PYTHONPATH to import it (a module
    outside the installed package, e.g. the failure matrix's test-only mutants)."""

    module_path: str
    config: Mapping[str, Any] = field(default_factory=dict)
    factory_name: str = "build_server_modules"
    pythonpath: tuple[str, ...] = ()

    def server_pythonpath(self, inherited: str | None) -> str:
        """PYTHONPATH of the LMCache process: ``pythonpath``, then what bsrctl inherited."""
        return os.pathsep.join([*self.pythonpath, *([inherited] if inherited else [])])

    def to_json(self) -> dict[str, Any]:
        """The ``--server-module`` JSON object (a fresh copy each call)."""
        return {
            "module_path": self.module_path,
            "factory_name": self.factory_name,
            "config": dict(self.config),
        }


@dataclass(frozen=True)
class L2Device:
    """What the FS tier should cost: reads paced at ``bandwidth_bytes_s`` with
    ``latency_s`` per op by the wrapper's shaping (``adapters.shaping``), and O_DIRECT
    where the filesystem takes it (``odirect_allowed``), so staging is not a page-cache
    copy. A fast tier of MiBs then stands in for one of GiBs at the same time scale."""

    bandwidth_bytes_s: float
    latency_s: float = 0.0
    use_odirect: bool = False

    def shape(self) -> dict[str, float]:
        return {"bandwidth_bytes_s": self.bandwidth_bytes_s, "latency_s": self.latency_s}


def odirect_allowed(path: Path) -> bool:
    """Does the filesystem of ``path`` (a folder, created if missing) take O_DIRECT?
    tmpfs does not; the caller then runs buffered and says so in its evidence."""
    path.mkdir(parents=True, exist_ok=True)
    probe = path / ".odirect-allowed"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    except OSError:
        return False
    else:
        os.close(fd)
        return True
    finally:
        probe.unlink(missing_ok=True)


@dataclass(frozen=True)
class L1Options:
    """LMCache's L1 options beyond its defaults: the L2 prefetch policy (``retain``: staged
    objects stay in L1 once unpinned, for the stock lookup) and the read-lock TTL."""

    prefetch_policy: str | None = None
    read_ttl_s: int | None = None


@dataclass(frozen=True)
class TempoKVLaunch:
    """TempoKV on the serving stack: vLLM schedules with the runtime adapter (its settings
    in ``BSRKV_TEMPOKV``, the TempoKV wire's ``AdapterEnv``), LMCache keeps staged objects
    in L1 once unpinned (``retain``) and holds read locks (the pins) longer than any
    protection lasts. ``async_scheduling`` is vLLM's, as ``profile.async_scheduling()`` decides
    it from the spec: the adapter's class follows it (the async one under vLLM's batch
    queue)."""

    adapter: AdapterSettings
    read_ttl_s: int = 600
    trace_path: str | None = None
    # "connector": updates reach the server module; "record": kept in vLLM's process, no
    # server call (the adapter cost bench's arm that separates the adapter from its RPCs)
    transport: str = "connector"
    async_scheduling: bool = False
    # a class vLLM schedules with instead of the adapter (the adapter cost bench's arms:
    # ``RecordingScheduler``, the stock scheduler with only the step trace); None: the adapter
    scheduler: str | None = None

    @property
    def l1_options(self) -> L1Options:
        """TempoKV's: ``retain``, and read locks (the pins) that outlive any protection."""
        return L1Options("retain", self.read_ttl_s)

    @property
    def scheduler_cls(self) -> str:
        """vLLM's ``--scheduler-cls``: the adapter matching its scheduling."""
        return self.scheduler or tempokv_scheduler_cls(self.async_scheduling)

    def vllm_env(self) -> dict[str, str]:
        import json

        from bsrkv.tempokv.wire import AdapterEnv

        env = AdapterEnv(self.adapter, self.transport, self.trace_path)
        return {"BSRKV_TEMPOKV": json.dumps(env.to_json())}


@dataclass(frozen=True)
class LMCacheExtensions:
    """What a serving stack's LMCache loads beyond stock LMCache: a server module, and the
    parameters of bsrctl's L2 adapters (each behind the fault wrapper)."""

    server_module: ServerModule
    load_concurrency: int = 1  # L2 loads in flight per rank (bsr_fs reads, bsr_mooncake batches)
    checksum: bool = True  # a checksum per L2 object, verified before install
    checksum_algorithm: str = "xxh3_128"  # its algorithm (adapters.checksum)
    l2_device: L2Device | None = None  # an SSD-like FS tier (TempoKV); None: as it comes
    tempokv: TempoKVLaunch | None = None  # the runtime adapter in vLLM (TempoKV runs)
    # L1 options without TempoKV (Figure 6's stock arm with TempoKV's options); None: TempoKV's
    # when it runs, LMCache's defaults otherwise
    l1: L1Options | None = None
    # the flash tier: L1 on a Device-DAX arena in a memory-limited, read-throttled cgroup
    # (``stack/launch/fast_tier.py``); None: L1 in DRAM
    fast_tier: FastTierConfig | None = None

    @property
    def l1_options(self) -> L1Options:
        if self.l1 is not None:
            return self.l1
        return self.tempokv.l1_options if self.tempokv is not None else L1Options()

    @property
    def retrieve_deadline_s(self) -> float | None:
        """How long one retrieve of the server module may take (0: unbounded); None when the
        module declares no bound (it does not retrieve on its own)."""
        got = self.server_module.config.get("retrieve_deadline_s")
        return None if got is None else float(got)

    def fs_adapter(self, base_path: Path, control: Path) -> dict[str, Any]:
        """The ``--l2-adapter`` spec of the FS tier under ``base_path`` (O_DIRECT and the
        device shape when ``l2_device`` asks for them)."""
        inner: dict[str, Any] = {
            "type": "bsr_fs",
            "base_path": str(base_path),
            "load_concurrency": self.load_concurrency,
            "checksum": self.checksum,
            "checksum_algorithm": self.checksum_algorithm,
        }
        device = self.l2_device
        if device is not None and device.use_odirect:
            inner["use_odirect"] = True
        shape = device.shape() if device is not None else None
        return fault_wrapped("fs", inner, control, shape=shape)

    def mooncake_adapter(self, params: Mapping[str, Any], control: Path) -> dict[str, Any]:
        """The ``--l2-adapter`` spec of the Mooncake tier with these adapter params. Its load
        workers (batch_get_into calls in flight) are the restore's load concurrency unless
        the params name them: two windows' batches fetched at once contend on the store's
        transfer and ran slower than one after the other (bench/restore_bandwidth.py)."""
        inner = {"type": "bsr_mooncake", "load_workers": self.load_concurrency, **params}
        verify = self.checksum_algorithm if self.checksum else None
        return fault_wrapped("mooncake", inner, control, verify=verify)


def bsr_extensions(
    settings: RestoreSettings,
    module_path: str = BSR_SERVER_MODULE,
    extra_config: Mapping[str, Any] | None = None,
    pythonpath: tuple[str, ...] = (),
) -> LMCacheExtensions:
    """bsrctl's BSR server module and L2 adapters, configured from ``settings``.

    ``module_path``/``extra_config``/``pythonpath``: load another module with the same config
    plus these keys (the failure matrix's tests: ``failmatrix_mutants``, ``{"mutations": []}``).
    """
    # The server module's config is RestoreSettings itself (ServerModuleConfig), B explicit.
    config: dict[str, Any] = settings.to_json()
    config["admission_budget_chunks"] = settings.budget_chunks
    config.update(extra_config or {})
    return LMCacheExtensions(
        ServerModule(module_path, config, pythonpath=pythonpath),
        load_concurrency=settings.load_concurrency,
        checksum=settings.checksum,
        checksum_algorithm=settings.checksum_algorithm,
    )


def fault_wrapped(
    name: str,
    inner: dict[str, Any],
    control: Path,
    verify: str | None = None,
    shape: dict[str, float] | None = None,
) -> dict[str, Any]:
    """An --l2-adapter spec: `inner` behind bsrctl's fault adapter, loaded via LMCache's
    plugin type (the server builds adapters before any server module runs); `shape`
    paces its loads (``adapters.shaping``); `verify`: the checksum algorithm the wrapper
    checks loads with (None: no check)."""
    params: dict[str, Any] = {"name": name, "control_path": str(control), "inner": inner}
    if shape is not None:
        params["shape"] = dict(shape)
    if verify:  # the inner adapter keeps no checksums of its own (Mooncake)
        params.update(
            verify=True,
            checksum_algorithm=verify,
            checksum_dir=str(control.parent / f"checksums-{name}"),
        )
    return {
        "type": "plugin",
        "module_path": FAULT_ADAPTER_MODULE,
        "class_name": "BsrFaultL2Adapter",
        "adapter_params": params,
    }


def write_control_file(path: str | Path, rules: list[dict]) -> None:
    """Arm (or with ``[]`` clear) a tier's fault wrapper: rewrite its control file."""
    from bsrkv.lmcache_ext.faults.control import write_control_file as write

    write(path, rules)


# ---- vLLM's scheduling: which TempoKV scheduler class a launch names ----------------------
# Whether vLLM schedules asynchronously, decided once from the spec, and what follows from
# it: the flag that makes vLLM resolve the same, and the TempoKV scheduler class that matches
# (imports no vLLM: the launch side and the device profile read it).
#
# vLLM 0.32 resolves ``scheduler_config.async_scheduling`` in ``VllmConfig.__post_init__``
# (vllm/config/vllm.py:1553-1644): explicitly on, any incompatibility is an error; unset
# (None), it turns on unless the model pools, the speculative method or the executor cannot,
# ROCm DeepEP DBO, or pipeline parallelism on the V1 runner; explicitly off, it stays off.
# The platform hook then has the last word (vllm/config/vllm.py:1991-1993): the CPU platform
# turns it off whatever was asked (vllm/platforms/cpu.py:329-331). With it on, the engine
# core runs a two-deep batch queue (``max_concurrent_batches`` 2, vllm/config/vllm.py:577-587;
# ``step_with_batch_queue``, vllm/v1/engine/core.py:698-812): step N+1 is scheduled before
# step N's output is processed. A plain ``Scheduler`` adds no output placeholders there, so
# it cannot schedule a decode before the previous token is back (vLLM warns of "degraded
# performance", vllm/config/scheduler.py:239-250): the launch must match the class to it.
#
# bsrctl's deployments never set what turns an unset value off on CUDA (no pooling model,
# no speculative decoding, the mp/uni executors, no pipeline parallelism), so the decision
# below is vLLM's; the cuda profile passes the explicit flag, so vLLM refuses to
# start rather than silently disagree if that ever changes.


SYNC_SCHEDULER = "bsrkv.vllm_ext.scheduler.TempoKVScheduler"
ASYNC_SCHEDULER = "bsrkv.vllm_ext.scheduler.TempoKVAsyncScheduler"


def tempokv_scheduler_cls(async_on: bool) -> str:
    """The TempoKV ``--scheduler-cls`` for vLLM's scheduling: the async adapter under a
    batch queue, the sync one otherwise."""
    return ASYNC_SCHEDULER if async_on else SYNC_SCHEDULER


# ---- the storage stack's side: LMCache's StorageManager in-process ------------------------


def bsr_fs_config(
    base_path: Path,
    use_odirect: bool,
    load_concurrency: int,
    checksum: bool = False,
    checksum_algorithm: str = "xxh3_128",
) -> Any:
    """The ``bsr_fs`` L2 adapter's config (concurrent loads, checksum sidecars verified at
    load when ``checksum``); ImportError if unavailable."""
    from bsrkv.lmcache_ext.adapters.fs import BsrFSL2AdapterConfig

    return BsrFSL2AdapterConfig(
        base_path=str(base_path),
        use_odirect=use_odirect,
        load_concurrency=load_concurrency,
        checksum=checksum,
        checksum_algorithm=checksum_algorithm,
    )


def fs_checksum(algorithm: str) -> Any:
    """The ``bsr_fs`` adapter's checksum (``adapters.checksum.Checksum``): its sidecar suffix
    and lines, for writing the sidecars the adapter verifies at load."""
    from bsrkv.lmcache_ext.adapters.checksum import Checksum

    return Checksum(algorithm)


def mooncake_config(master: str, key_prefix: str, load_workers: int) -> Any:
    """The ``bsr_mooncake`` L2 adapter's config (in-process, in the store's namespace)."""
    from bsrkv.lmcache_ext.adapters.mooncake import BsrMooncakeL2AdapterConfig

    return BsrMooncakeL2AdapterConfig.from_dict(
        {"master_server_address": master, "key_prefix": key_prefix, "load_workers": load_workers}
    )


def mooncake_name(key: Any, key_prefix: str) -> str:
    """The Mooncake object name the ``bsr_mooncake`` adapter uses for an ObjectKey."""
    from bsrkv.lmcache_ext.adapters.mooncake import mooncake_key

    return mooncake_key(key, key_prefix)


def fault_wrapped_config(
    name: str, inner: Any, control: Path, shape: dict[str, float] | None = None
) -> Any:
    """An in-process L2 adapter config: `inner` behind bsrctl's fault adapter, re-reading
    the rules in `control` (the storage stack's counterpart of ``fault_wrapped``)."""
    from bsrkv.lmcache_ext.adapters.shaping import DeviceShape
    from bsrkv.lmcache_ext.faults import adapter as _registers_the_type  # noqa: F401
    from bsrkv.lmcache_ext.faults.config import BsrFaultL2AdapterConfig

    return BsrFaultL2AdapterConfig(
        inner, name=name, control_path=str(control), shape=DeviceShape.parse(shape)
    )


def restore_storage(
    sm: Any, layouts: Mapping[int, Any], drain_timeout_s: float, staging: str = "prefetch"
) -> RestoreStorage:
    """The BSR core's RestoreStorage over one LMCache StorageManager; ``staging``: how its
    windows reach L1 (``RestoreSettings.window_staging``; the whole plan's is "prefetch")."""
    from bsrkv.lmcache_ext.bsr.storage import LMCacheRestoreStorage

    return LMCacheRestoreStorage(sm, layouts, drain_timeout_s=drain_timeout_s, staging=staging)


def layout_descs(reg: Registration) -> dict[int, Any]:
    """LMCache's memory layout of each object group of ``reg``."""
    from bsrkv.lmcache_ext.bsr.storage import layout_descs as descs

    return descs(reg)
