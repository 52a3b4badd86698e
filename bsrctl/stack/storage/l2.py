"""The storage stack's LMCache configs: its L2 tier (stock FS, bsrctl's FS adapter, behind the
fault adapter when a control file exists, or Mooncake) and each rank's StorageManager."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmcache.v1.distributed.config import (
    EvictionConfig,
    L1ManagerConfig,
    L1MemoryManagerConfig,
    StorageManagerConfig,
)
from lmcache.v1.distributed.l2_adapters.config import L2AdaptersConfig
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2AdapterConfig

from bsrctl.errors import BadInput
from bsrctl.stack.launch import extensions
from bsrctl.stack.storage.config import StorageStackConfig


def adapter_config(
    config: StorageStackConfig, l2_dir: Path, mooncake_prefix: str, fault_control: Path, name: str
) -> Any:
    """One rank's L2 adapter config; ``name`` names its fault wrapper."""
    if config.l2_adapter == "bsr_mooncake":
        # load_concurrency: the adapter's load workers (batches in flight per rank)
        return extensions.mooncake_config(
            config.mooncake_master, mooncake_prefix, config.restore.load_concurrency
        )
    inner = fs_config(config, l2_dir)
    if fault_control.is_file():
        return extensions.fault_wrapped_config(name, inner, fault_control)
    return inner


def fs_adapter_kind(config: StorageStackConfig) -> str:
    """The FS tier's adapter: "stock" or "bsr_fs" (auto: bsr_fs iff load_concurrency > 1)."""
    if config.l2_adapter != "auto":
        return config.l2_adapter
    return "bsr_fs" if config.restore.load_concurrency > 1 else "stock"


def tier_integrity(config: StorageStackConfig) -> str:
    """What the L2 tier checks of an object's bytes at load: the checksum algorithm of the
    sidecars ``bsr_fs`` verifies (``restore.checksum``), else "none": LMCache's stock FS
    adapter keeps no checksum, and this stack's Mooncake tier verifies none."""
    c = config.restore
    if fs_adapter_kind(config) == "bsr_fs" and c.checksum:
        return c.checksum_algorithm
    return "none"


def fs_config(config: StorageStackConfig, l2_dir: Path) -> Any:
    c = config.restore
    kind = fs_adapter_kind(config)
    if kind == "stock":
        if c.load_concurrency != 1:
            raise BadInput(
                "load_concurrency > 1 needs l2_adapter 'bsr_fs' "
                "(the stock FS adapter loads serially)"
            )
        return FSL2AdapterConfig(base_path=str(l2_dir), use_odirect=c.use_odirect)
    try:
        return extensions.bsr_fs_config(
            l2_dir, c.use_odirect, c.load_concurrency, c.checksum, c.checksum_algorithm
        )
    except ImportError as e:
        raise BadInput(f"l2_adapter 'bsr_fs' unavailable ({e}); use l2_adapter 'stock'") from e


def manager_config(l1_bytes: int, l1_segment: str, l2_adapter: Any) -> StorageManagerConfig:
    """A rank's StorageManager: an eager L1 pool in /dev/shm ``l1_segment``, LRU, one L2."""
    l1 = L1ManagerConfig(
        L1MemoryManagerConfig(size_in_bytes=l1_bytes, use_lazy=False, shm_name=l1_segment)
    )
    return StorageManagerConfig(
        l1_manager_config=l1,
        eviction_config=EvictionConfig("LRU"),
        l2_adapter_config=L2AdaptersConfig([l2_adapter]),
    )
