"""Small fixtures: a virtual clock, a simulated device and a provider with round numbers."""

from __future__ import annotations

import pytest

from bsrctl.tempokv.sim.device import DeviceConfig, SimStagingDevice
from bsrkv.clock import VirtualClock
from bsrkv.tempokv.kv import GIB, KvObject, Manifest
from bsrkv.tempokv.provider import StagingProvider
from bsrkv.tempokv.ttr import RateMeter

RATE = 8 * GIB  # 1 GiB objects stage in 1/8 s each


def objs(tag: str, n: int, size: int = GIB) -> Manifest:
    return Manifest(tuple(KvObject(f"{tag}/{i}", size) for i in range(n)))


def make_provider(
    clock: VirtualClock, capacity_gib: int = 100, budget_gib: int = 50, concurrency: int = 1
) -> StagingProvider:
    cfg = DeviceConfig(
        staging_bytes_s=RATE,
        contention=0.0,
        concurrency=concurrency,
        capacity_bytes=capacity_gib * GIB,
        budget_bytes=budget_gib * GIB,
    )
    return StagingProvider(
        clock,
        SimStagingDevice(clock, cfg),
        cfg.capacity_bytes,
        cfg.budget_bytes,
        concurrency,
        RateMeter(RATE),
    )


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()
