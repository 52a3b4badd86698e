"""A serving run on the flash tier (``serving.fast_tier``, ``stack/launch/fast_tier.py``): what
changes from DRAM L1 + shaped FS L2.

- the deployment: no L2; LMCache's whole L1 is the arena (``--l1-devdax-path``);
- seeding: each document stored once into L1 (the arena: the flash copy) by a cold
  request, checked by L1's usage growing by its whole chunks, and flushed; then the tier is
  sealed (the server's base measured, its cgroup limited to base + fast tier, cleared);
- before each cell: vLLM forgets its prefix cache and the fast tier is cleared (the arena's
  page cache dropped): never ``bsr.forget``, which here would delete the flash copy;
- per cell: the cgroup's ``memory.stat`` and the throttle's counters, before and after."""

from __future__ import annotations

import time
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.specs import StackSpec
from bsrctl.stack.launch.fast_tier import FastTier, FastTierConfig
from bsrctl.tempokv.flash_spec import demand_iops
from bsrctl.tempokv.spec import ServingRun

SEED_WAIT_S = 20.0  # a store reaches L1 asynchronously (the connector's store RPC is queued)


def fast_tier_config(run: ServingRun) -> FastTierConfig | None:
    ft = run.fast_tier
    if ft is None:
        return None
    return FastTierConfig(
        ft.arena_bytes, ft.fast_tier_bytes, ft.flash_bytes_s, demand_iops(ft.demand_bytes_s)
    )


def flash_stack(stack: StackSpec, run: ServingRun) -> StackSpec:
    """The deployment on the flash tier: L1 is the arena, no FS L2 (nothing below it)."""
    if run.fast_tier is None:
        return stack
    lm = stack.lmcache.model_copy(
        update={"fs_l2": False, "l1_size_bytes": run.fast_tier.arena_bytes}
    )
    return stack.model_copy(update={"lmcache": lm})


def tier_of(stack: Any) -> FastTier:
    tier = getattr(stack, "fast_tier", None)
    if tier is None:
        raise StackFailed("the flash tier is not up on this stack (serving.fast_tier)")
    return tier


def seed_flash(
    stack: Any, client: Any, docs: list[list[int]], chunk_tokens: int, chunk_bytes: int
) -> tuple[list[bool], dict[str, Any]]:
    """Each document into L1 once (a cold request), whole (L1 grew by its whole chunks
    within ``SEED_WAIT_S``) and flushed; then the tier sealed. Per document whether it is
    whole, and the seal's measures (base, limit, what clearing left)."""
    tier = tier_of(stack)
    whole = []
    for doc in docs:
        before = client.peak().l1_used_bytes
        want = before + (len(doc) // chunk_tokens) * chunk_bytes
        stack.complete(doc, 1)
        deadline = time.monotonic() + SEED_WAIT_S
        while client.peak().l1_used_bytes < want and time.monotonic() < deadline:
            time.sleep(0.1)
        whole.append(client.peak().l1_used_bytes >= want)
        tier.flush()
    stack.forget_local()
    return whole, tier.seal()


def clear_cell(stack: Any) -> dict[str, Any]:
    """Before a cell: vLLM forgets locally, the fast tier is emptied (the flash copy
    stays). What stayed resident (TempoKV is off by now: nothing is mlocked)."""
    stack.forget_local()
    return tier_of(stack).clear()


def counters(stack: Any) -> dict[str, Any]:
    """The server cgroup's memory.stat and usage, the throttle's counters of the arena."""
    return tier_of(stack).counters()


def cell_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What one cell read from flash (the throttle's Read bytes) and the cgroup after it."""
    read = after["throttle_io_service_bytes"].get("Read", 0)
    read -= before["throttle_io_service_bytes"].get("Read", 0)
    ios = after["throttle_io_serviced"].get("Read", 0) - before["throttle_io_serviced"].get(
        "Read", 0
    )
    return {"flash_read_bytes": read, "flash_reads": ios, "before": before, "after": after}
