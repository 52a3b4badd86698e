"""``serving.fast_tier``: a memory-semantic flash tier on one machine (the paper's §5.3
deployment, ``bsrctl/stack/launch/fast_tier.py`` builds it). LMCache's whole L1 is an arena on a
read-throttled device (the flash); the LMCache server's memory cgroup keeps at most
``fast_tier_mib`` of it resident beyond its own base (the device's DRAM)."""

from __future__ import annotations

from pydantic import Field

from bsrctl.spec_io import Strict

MIB = 1 << 20


class FastTierSpec(Strict):
    arena_mib: int = Field(
        gt=0,
        description="the device's exposed memory, LMCache's whole L1 (--l1-devdax-path): "
        "holds every document and what requests store; LMCache evicts past it",
    )
    fast_tier_mib: float = Field(
        gt=0,
        description="the device's DRAM: page cache of the arena the LMCache server's memory "
        "cgroup keeps beyond its measured base (limit = base + this)",
    )
    flash_mib_s: float = Field(
        gt=0,
        description="reads of the arena's device, throttled (blkio.throttle.read_bps_device): "
        "the SSD behind the fast tier; also TempoKV's TTR prior",
    )

    @property
    def arena_bytes(self) -> int:
        return self.arena_mib * MIB

    @property
    def fast_tier_bytes(self) -> int:
        return int(self.fast_tier_mib * MIB)

    @property
    def flash_bytes_s(self) -> int:
        return int(self.flash_mib_s * MIB)
