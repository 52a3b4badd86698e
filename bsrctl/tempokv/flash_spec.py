"""``serving.fast_tier``: a memory-semantic flash tier on one machine (the paper's §5.3
deployment, ``bsrctl/stack/launch/fast_tier.py`` builds it). LMCache's whole L1 is an arena on a
read-throttled device (the flash); the LMCache server's memory cgroup keeps at most
``fast_tier_mib`` of it resident beyond its own base (the device's DRAM).

The flash has two read paths, as SSD-backed CXL memory does: bulk, software-directed reads
(TempoKV's staging: ``readahead`` in 1 MiB pieces) are bound by its bandwidth
(``flash_mib_s``), a page faulted in on demand (LMCache-DAX's retrieve: 4 KiB, one in
flight) by its request rate (``demand_mib_s`` / 4 KiB per second)."""

from __future__ import annotations

from pydantic import Field

from bsrctl.spec_io import Strict

MIB = 1 << 20
PAGE = 4096  # a demand fault's read: one page (readahead off)


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
        "the SSD behind the fast tier read in bulk (staging); also TempoKV's TTR prior",
    )
    demand_mib_s: float | None = Field(
        default=None,
        gt=0,
        description="pages faulted in on demand, 4 KiB each (blkio.throttle.read_iops_device "
        "= this / 4 KiB): the device's miss path; unset: the bandwidth's rate (ratio 1)",
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

    @property
    def demand_bytes_s(self) -> int:
        return self.flash_bytes_s if self.demand_mib_s is None else int(self.demand_mib_s * MIB)

    @property
    def demand_ratio(self) -> float:
        """Demand rate over staging rate."""
        return self.demand_bytes_s / self.flash_bytes_s


def demand_iops(demand_bytes_s: float) -> int:
    """The IOPS cap whose 4 KiB faults read ``demand_bytes_s`` (at least 1)."""
    return max(1, round(demand_bytes_s / PAGE))
